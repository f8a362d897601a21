"""Each request's life over engine steps, rebuilt from the engine's lifecycle events alone.

The app's timeline panel (a Gantt over steps) and the Perfetto export (spans over time) both
read these tracks, so "when was #7 queued, prefilled, decoding, preempted" has one answer.
No torch, no textual: a recording can be turned into tracks on any machine.

A step number means "during that engine step": a request queued while the engine sat at step
k shows as queued from step k; its first admission step is prefill (the seed's scheduler
computes a whole context in the admission step, chunked prefill spreads it over the steps
that carry a chunk: either way a prefill ends with the chunk that reaches the context's end,
and both emit a "prefill" event per chunk); decode follows
until the step it finished, was aborted, or failed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from tinyllm.observe.snapshot import ENDED_STATES, FORK_OF, LifecycleEvent

PHASES = ("queued", "prefill", "decode", "preempted")  # what a span can be
ENDS = tuple(ENDED_STATES)  # how a track can end


@dataclass(frozen=True)
class Span:
    phase: str  # one of PHASES
    start_step: int
    start_s: float
    end_step: int | None = None  # the last step of the span; None while it is the open one
    end_s: float | None = None

    def covers(self, step: int, now_step: int) -> bool:
        end = now_step if self.end_step is None else self.end_step
        return self.start_step <= step <= end


@dataclass(frozen=True)
class Track:
    """One request's life so far. Immutable: a new Track replaces the old one on each event,
    so viewers can tell what changed by identity."""

    rid: int
    spans: tuple[Span, ...] = ()
    end: str | None = None  # one of ENDS once the request is over
    end_step: int | None = None
    end_s: float | None = None
    slot: int | None = None  # the slot it holds now (None when not admitted)
    admissions: tuple[tuple[int, int], ...] = ()  # (step, prefix-cached tokens) per admission
    chunk_steps: tuple[int, ...] = ()  # steps that computed a prefill chunk (chunked only)
    preempt_steps: tuple[int, ...] = ()
    waits: tuple[tuple[int, str], ...] = ()  # (step, WAIT_REASONS code from that step on; "" = computing)
    draft_steps: tuple[int, ...] = ()  # steps that verified a speculative draft of it (Timeline.note_drafts)

    @property
    def open_span(self) -> Span | None:
        return self.spans[-1] if self.spans and self.spans[-1].end_step is None else None

    def wait_spans(self, now_step: int) -> list[tuple[int, int, str]]:
        """(first step, last step, code) for each stretch it waited for one reason."""
        last = self.end_step if self.end_step is not None else now_step
        out = []
        for i, (s, code) in enumerate(self.waits):
            end = self.waits[i + 1][0] - 1 if i + 1 < len(self.waits) else last
            if code and end >= s:
                out.append((s, end, code))
        return out

    def phase_at(self, step: int, now_step: int) -> str | None:
        """The span phase covering ``step`` (None before the request existed or after it ended)."""
        if self.end_step is not None and step > self.end_step:
            return None
        for sp in reversed(self.spans):
            if sp.covers(step, now_step):
                return sp.phase
        return None


def _close(spans: tuple[Span, ...], step: int, time_s: float) -> tuple[Span, ...]:
    """End the open span at the step before ``step`` (it gives way to what starts at ``step``);
    a span that would end before it began is dropped (it lasted no step at all)."""
    if not spans or spans[-1].end_step is not None:
        return spans
    last = spans[-1]
    if step - 1 < last.start_step:
        return spans[:-1]
    return spans[:-1] + (replace(last, end_step=step - 1, end_s=time_s),)


def _start(spans: tuple[Span, ...], phase: str, step: int, time_s: float) -> tuple[Span, ...]:
    return _close(spans, step, time_s) + (Span(phase, step, time_s),)


def _wait(waits: tuple[tuple[int, str], ...], step: int, code: str) -> tuple[tuple[int, str], ...]:
    """``waits`` with ``code`` from ``step`` on (a change within one step replaces the earlier)."""
    if waits and waits[-1][0] == step:
        waits = waits[:-1]
    if (waits[-1][1] if waits else "") == code:
        return waits
    return waits + ((step, code),)


class Timeline:
    """Folds lifecycle events into one Track per request, in request id order."""

    def __init__(self) -> None:
        self._tracks: dict[int, Track] = {}

    def feed(self, events: Iterable[LifecycleEvent]) -> None:
        for ev in events:
            t = self._tracks.get(ev.rid) or Track(rid=ev.rid)
            self._tracks[ev.rid] = self._apply(t, ev)

    @staticmethod
    def _apply(t: Track, ev: LifecycleEvent) -> Track:
        k, s, ts = ev.kind, ev.step, ev.time_s
        if k == "queued":
            return replace(t, spans=_start(t.spans, "queued", s, ts))
        if k == "admitted":
            spans = _start(t.spans, "prefill", s, ts)
            if ev.reason.startswith(FORK_OF):  # a fork samples at once: decoding from the next step
                spans = _start(spans, "decode", s + 1, ts)
            return replace(
                t, spans=spans, slot=ev.slot, admissions=t.admissions + ((s, ev.cached),), waits=_wait(t.waits, s, "")
            )
        if k == "waiting":
            return replace(t, waits=_wait(t.waits, s, ev.reason.partition(":")[0]))
        if k == "prefill":
            chunks = t.chunk_steps if t.chunk_steps and t.chunk_steps[-1] == s else t.chunk_steps + (s,)
            _, end, total = ev.prefill_span()
            done = end == total
            spans = _start(t.spans, "decode", s + 1, ts) if done else t.spans
            return replace(t, chunk_steps=chunks, spans=spans)
        if k == "preempted":
            return replace(
                t,
                spans=_start(t.spans, "preempted", s, ts),
                slot=None,
                preempt_steps=t.preempt_steps + (s,),
                waits=_wait(t.waits, s, "preempted"),
            )
        if k in ENDS:
            spans = _close(t.spans, s + 1, ts)  # the end step still belongs to the span
            return replace(t, spans=spans, end=k, end_step=s, end_s=ts, slot=None)
        return t

    def note_drafts(self, snap) -> None:
        """The requests whose speculative draft the snapshot's step verified (engine/speculate.py):
        lifecycle events do not carry drafts, each step's snapshot does (only requests in its batch
        with more than one token can have had one)."""
        if not getattr(snap, "speculative", 0):
            return
        step = snap.counters.steps
        for rid, n in snap.batch:
            t = self._tracks.get(rid) if n > 1 else None
            v = snap.request(rid) if t is not None else None
            if v is not None and v.last_draft and v.last_draft_step == step and step not in t.draft_steps[-1:]:
                self._tracks[rid] = replace(t, draft_steps=t.draft_steps + (step,))

    def forget(self, rid: int) -> None:
        """Drop a request's track (the engine forgot the request)."""
        self._tracks.pop(rid, None)

    def track(self, rid: int) -> Track | None:
        return self._tracks.get(rid)

    def tracks(self) -> tuple[Track, ...]:
        return tuple(self._tracks.values())


def build_tracks(events: Iterable[LifecycleEvent]) -> tuple[Track, ...]:
    tl = Timeline()
    tl.feed(events)
    return tl.tracks()
