"""Each ended request's SLO verdict as a recording stores it: one judge for every recorder (the
app's ``--record`` and ``tinyllm serve --record``), so a trace or a what-if reads the same
verdicts whichever wrote the file."""

from __future__ import annotations

from tinyllm.observe.snapshot import EngineSnapshot, LifecycleEvent
from tinyllm.observe.timeline import ENDS, Timeline
from tinyllm.slo import SLO, track_waits, verdict_record, view_verdict


class VerdictJudge:
    """Folds lifecycle events (for the reason a miss waited most) and judges requests as they
    end: by their own SLO (``own``, a workload line's) or else the run's ``slo``."""

    def __init__(self, slo: SLO | None = None):
        self.slo = slo
        self.own: dict[int, SLO] = {}  # requests' own SLOs
        self._timeline = Timeline()

    def judge(self, snap: EngineSnapshot, events: list[LifecycleEvent]) -> dict[int, dict]:
        """The verdict records (``verdict_record``) of the requests that ended in ``events`` and
        have an SLO; ``snap``: the snapshot taken after them."""
        self._timeline.feed(events)
        out = {}
        views = {v.rid: v for v in snap.requests}
        for ev in events:
            slo = self.own.get(ev.rid) or self.slo
            view = views.get(ev.rid)
            if ev.kind not in ENDS or slo is None or view is None:
                continue
            waited = track_waits(self._timeline.track(ev.rid), snap.counters.steps)
            verdict = view_verdict(view, slo, waited)
            if verdict is not None:
                out[ev.rid] = verdict_record(verdict, slo)
        for ev in events:
            if ev.kind in ENDS:
                self._timeline.forget(ev.rid)  # its life is over: nothing more to judge
        return out
