"""What a race's or a what-if's verdict rests on: each request judged against its SLO, each
lane's goodput, and the rule the lanes are ranked by, said in words.

Without arrivals every lane has the same work in hand from the start: the lane that finishes it
first wins. With arrivals every lane's clock runs to about the last arrival, so tok/s is the
arrival rate, not the lane's speed: lanes are ranked by goodput (requests/s meeting the SLO, with
--slo) and then by latency p95. A request a recording saw aborted or failed is judged apart: it
is marked, and left out of the rankings. No torch: the app and ``tinyllm whatif`` both use this.
"""

from __future__ import annotations

from dataclasses import dataclass

from tinyllm.observe.stats import percentile
from tinyllm.race.views import LaneView, RequestOutcome
from tinyllm.slo import ENDED_APART, SLO, SLOSummary, SLOVerdict, judge, tpot


@dataclass(frozen=True)
class Judging:
    """What each request (by id: arrival order, as every lane numbers them) is judged against:
    the run's SLO, a workload line's own, and how a recording says it ended."""

    slo: SLO | None = None  # --slo
    own: tuple[SLO | None, ...] = ()  # per request: a workload line's "slo" (None: the run's)
    ended: tuple[str, ...] = ()  # per request: how the recording saw it end ("" where unknown)

    @property
    def active(self) -> bool:
        """Whether any request has an SLO (else no goodput to show)."""
        return self.slo is not None or any(s is not None for s in self.own)

    def slo_for(self, rid: int) -> SLO | None:
        own = self.own[rid] if 0 <= rid < len(self.own) else None
        return own or self.slo

    def left_out(self, rid: int) -> str:
        """ "aborted" / "failed" where the recording saw the request end so (it is left out of the
        rankings: its client went away, or the engine gave up on it); "" otherwise."""
        state = self.ended[rid] if 0 <= rid < len(self.ended) else ""
        return state if state in ENDED_APART else ""

    def verdict(self, o: RequestOutcome) -> SLOVerdict | None:
        """The request's verdict in one lane (None: it has no SLO)."""
        slo = self.slo_for(o.rid)
        if slo is None:
            return None
        return judge(slo, o.ttft_s, outcome_tpot(o), o.waited, self.left_out(o.rid) or "finished")

    def verdicts(self, lane: LaneView) -> dict[int, SLOVerdict]:
        return {o.rid: v for o in lane.outcomes if (v := self.verdict(o)) is not None}

    def summary(self, lane: LaneView) -> SLOSummary | None:
        """The lane's goodput over its finishing time (None: no SLO, or not finished)."""
        if not self.active or lane.result is None:
            return None
        return SLOSummary.of(self.verdicts(lane).values(), lane.result.wall_s)


def outcome_tpot(o: RequestOutcome) -> float | None:
    """Time per output token after the first, from the outcome's TTFT and end-to-end time."""
    return tpot(o.ttft_s, o.e2e_s, o.new_tokens)


def has_arrivals(lanes: tuple[LaneView, ...]) -> bool:
    """Whether requests arrived over time (a request arriving after 0 s in any lane)."""
    return any(o.arrival_s > 0 for v in lanes for o in v.outcomes)


def latency_p95(lane: LaneView, judging: Judging) -> float:
    """End-to-end p95 over the requests not left out (the lane's own figure where it has no
    per-request outcomes)."""
    e2e = sorted(o.e2e_s for o in lane.outcomes if not judging.left_out(o.rid))
    if e2e:
        return percentile(e2e, 0.95)
    return lane.result.latency_p95_s if lane.result is not None else float("inf")


@dataclass(frozen=True)
class Ranking:
    """The lanes' places (by lane index, 1 first) and the rule that gave them, in words."""

    places: tuple[int, ...]
    rule: str  # e.g. "ranked by finishing time (no arrivals)"
    by: str  # "finishing time", "goodput", "latency p95"


def rank(lanes: tuple[LaneView, ...], judging: Judging | None = None, arrivals: bool | None = None) -> Ranking:
    """Place the finished lanes: without arrivals by finishing time; with arrivals by goodput
    (with an SLO) then latency p95. Lanes within TIE_WITHIN of each other on that figure share a
    place and the rule says they tie (a 0.02 s lead inside the clock's error is no verdict).
    ``arrivals`` None: from the outcomes (a lane without outcomes: say so)."""
    judging = judging or Judging()
    arrivals = has_arrivals(lanes) if arrivals is None else arrivals
    left = sum(bool(judging.left_out(i)) for i in range(len(judging.ended)))
    apart = f"; {left} request{'s' * (left != 1)} aborted or failed in the recording left out" if left else ""
    if not arrivals:
        key = [(v.result.wall_s if v.result else float("inf"),) for v in lanes]
        rule, by = (
            "ranked by finishing time (no arrivals: every lane had all the work from the start)",
            "finishing time",
        )
    elif judging.active:
        sums = [judging.summary(v) for v in lanes]
        key = [(-(s.goodput if s else 0.0), latency_p95(v, judging)) for v, s in zip(lanes, sums)]
        rule = "ranked by goodput, then latency p95 (requests arrive over time)"  # (ARRIVALS_NOTE says tok/s's part)
        by = "goodput"
    else:
        key = [(latency_p95(v, judging),) for v in lanes]
        rule = "ranked by latency p95 (requests arrive over time; --slo ranks by goodput first)"
        by = "latency p95"
    order = sorted(range(len(lanes)), key=lambda i: key[i])
    places = [0] * len(lanes)
    runs: dict[int, list[int]] = {}  # a run's first lane -> the lanes within TIE_WITHIN of it
    leader = None
    for place, i in enumerate(order, 1):
        if leader is not None and _within(key[i][0], key[leader][0]):
            places[i] = places[leader]
            runs[leader].append(i)
        else:
            places[i], leader = place, i
            runs[i] = [i]
    tied = [run for run in runs.values() if len(run) > 1]
    ties = "".join(
        f"; {_and([lanes[i].title for i in run])} tie: within {TIE_WITHIN:.0%} on {by}, inside the clock's error"
        for run in tied
    )
    return Ranking(tuple(places), rule + apart + ties, by)


TIE_WITHIN = 0.05  # lanes this close on the ranking's figure tie: the cost clock's own error (docs/lab.md)


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _within(a: float, b: float) -> bool:
    """Two figures (a time, or a goodput negated) within TIE_WITHIN of each other."""
    a, b = abs(a), abs(b)
    if a == b:
        return True
    if not (a < float("inf") and b < float("inf")):
        return False
    return abs(a - b) <= TIE_WITHIN * max(a, b)


def what_made_the_difference(lanes: tuple[LaneView, ...], ranking: Ranking) -> str:
    """One sentence on why the first-placed lane beat static batching, from the work each did:
    rows computed for requests already finished (static's waste), queueing (TTFT p95) and the
    winner's preemptions (recomputed work). Every lane runs the same forward, so these are the
    whole story. "" when no static lane finished behind a winner, or a lane is not done."""
    if any(v.result is None for v in lanes) or len(lanes) < 2:
        return ""
    best = lanes[ranking.places.index(1)]
    static = next((v for v in lanes if v.kind == "static"), None)
    if static is None or static is best:
        return ""
    s, b = static.result, best.result

    def wasted(r) -> str:
        share = 1 - r.useful_rows / r.computed_rows if r.computed_rows else 0.0
        return f"{r.computed_rows - r.useful_rows:,} of {r.computed_rows:,} rows ({share:.0%})"

    parts = [
        f"static batching computed {wasted(s)} for requests already finished, over {s.decode_steps:,} steps; "
        f"{best.title} wasted {wasted(b)} over {b.decode_steps:,}",
        f"queueing: TTFT p95 {s.ttft_p95_s * 1e3:,.0f} ms vs {b.ttft_p95_s * 1e3:,.0f} ms",
    ]
    if b.preemptions:
        parts.append(f"{best.title} preempted {b.preemptions:,} time(s) (recomputed work) and still won")
    return "what made the difference: " + "; ".join(parts)
