"""``tinyllm bench --slo``: each path's requests judged against the SLO (or a workload line's
own), its goodput over the path's wall time and the share that met it.

The bench's runs keep each request's TTFT and end (``Result``), not the steps it waited, so a
miss names its targets but no reason (what-if and the app name it)."""

from __future__ import annotations

from collections.abc import Sequence

from tinyllm.request import Result
from tinyllm.slo import SLO, SLOSummary, result_verdict


def path_slo(results: Sequence[Result], slos: Sequence[SLO | None], wall_s: float) -> dict | None:
    """A path's SLO figures for its JSON and table (``slos``: each request's SLO, in the order the
    requests ran; None where it has none); None when no request has one."""
    verdicts = [result_verdict(r, slo) for r, slo in zip(results, slos) if slo is not None]
    if not verdicts:
        return None
    out = SLOSummary.of(verdicts, wall_s).as_dict()
    del out["missed_by_reason"]  # (no reasons here: see the module docstring)
    return out


def request_slos(run_slo: SLO | None, own: Sequence[SLO | None]) -> list[SLO | None]:
    """Each request's SLO: its workload line's own, else the run's --slo."""
    return [mine or run_slo for mine in own]
