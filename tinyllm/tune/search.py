"""Which points run on how many requests: the whole grid for a small space, successive halving
for a large one, and the objective that orders them.

Successive halving (Jamieson & Talwalkar; Hyperband's inner loop) runs every point on a prefix
of the requests (by arrival), keeps the best third, runs those on a longer prefix, and so on to
all the requests. A prefix is the same traffic, only shorter: the points that fall behind on it
are those that queue, preempt or waste rows early. The defaults always run on every request,
so the answer compares the winner with them on the same work. Deterministic: the same points,
prefixes and cost clock give the same answer every run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tinyllm.tune.evaluate import Outcome
from tinyllm.tune.space import Point

OBJECTIVES = ("goodput", "throughput", "latency-p95")
GRID_MAX = 16  # up to this many points, every point runs on every request
KEEP = 3  # successive halving keeps the best 1/KEEP of each rung
MIN_PREFIX = 8  # requests in the shortest rung


def score(o: Outcome, objective: str) -> tuple:
    """Sort key, best first: the objective, then latency p95 and goodput to break ties (a point
    the engine refused sorts last)."""
    if o.error:
        return (1, 0.0, 0.0)
    if objective == "goodput":
        return (0, -o.goodput, o.latency_p95_s)
    if objective == "throughput":
        return (0, -o.tok_s, o.latency_p95_s)
    return (0, o.latency_p95_s, -o.goodput)


def ranked(outcomes: Sequence[Outcome], objective: str, first: Point | None = None) -> list[Outcome]:
    """Best first; among exact ties ``first`` (the defaults: no change without a gain), then the
    one holding less KV memory, then the order given (the grid's)."""
    return sorted(outcomes, key=lambda o: (*score(o, objective), o.point != first, o.peak_kv_mib))


def prefixes(n: int) -> list[int]:
    """The rungs' request counts: a quarter, a half, all (none shorter than MIN_PREFIX)."""
    out = sorted({min(n, max(MIN_PREFIX, math.ceil(n * f))) for f in (0.25, 0.5, 1.0)})
    return out


@dataclass
class Rung:
    requests: int
    outcomes: list[Outcome]  # ranked
    kept: int  # how many went on to the next rung


@dataclass
class SearchResult:
    method: str  # "grid" or "successive halving"
    rungs: list[Rung]
    final: list[Outcome]  # on every request, ranked (the defaults among them)
    defaults: Outcome
    points: int  # distinct configurations run
    runs: int  # point runs, all rungs
    seconds: float
    stopped: str = ""  # why the search stopped early (--budget-s), "" when it finished
    notes: list[str] = field(default_factory=list)


def search(
    points: Sequence[Point],
    defaults: Point,
    evaluate: Callable[[Sequence[Point], int], list[Outcome]],
    n_requests: int,
    objective: str,
    budget_s: float | None = None,
) -> SearchResult:
    """Run ``points`` (and ``defaults``) through ``evaluate(points, n)`` -> outcomes: the grid if
    small, else successive halving; stop before a rung that would start after ``budget_s``."""
    start = time.perf_counter()
    runs = 0
    if len(points) <= GRID_MAX or n_requests <= MIN_PREFIX:
        method, rung_sizes = "grid", [n_requests]
    else:
        method, rung_sizes = "successive halving", prefixes(n_requests)
    rungs: list[Rung] = []
    alive = list(points)
    stopped = ""
    for i, n in enumerate(rung_sizes):
        if rungs and budget_s is not None and time.perf_counter() - start > budget_s:
            stopped = (
                f"--budget-s {budget_s:g} ran out after the rung on {rungs[-1].requests} requests: "
                f"the ranking below is on that prefix, not on all {n_requests} requests"
            )
            break
        last = i == len(rung_sizes) - 1
        outs = ranked(evaluate(alive, n), objective)
        runs += len(outs)
        kept = len(outs) if last else max(1, math.ceil(len(outs) / KEEP))
        rungs.append(Rung(n, outs, kept))
        alive = [o.point for o in outs[:kept] if not o.error] or [outs[0].point]
    n_last = rungs[-1].requests
    base = evaluate([defaults], n_last)[0]
    final = ranked({o.point: o for o in [*rungs[-1].outcomes, base]}.values(), objective, defaults)
    return SearchResult(method, rungs, final, base, len(points), runs, time.perf_counter() - start, stopped)


def pareto_front(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """The points no other beats on both goodput (higher) and peak KV memory (lower), by memory."""
    ok = sorted((o for o in outcomes if not o.error), key=lambda o: (o.peak_kv_mib, -o.goodput))
    front, best = [], -1.0
    for o in ok:
        if o.goodput > best:
            front.append(o)
            best = o.goodput
    return front
