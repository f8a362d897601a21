"""Service-level objectives and goodput: whether each request met its latency targets, and why not.

An SLO has up to two targets, as ``vllm bench serve --goodput ttft:MS tpot:MS``: TTFT (arrival to
first token) and TPOT (time per output token after the first: (last - first token) / (tokens - 1)).
Goodput is the requests per second that met every target (DistServe); a miss carries the reason
the request waited most (a WAIT_REASONS code), so a verdict says what to change. A request that
was aborted or failed is neither met nor missed: it is counted apart.

One module for the app, the race, what-if, the bench, the server and the tuner. No torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

TARGETS = ("ttft", "tpot")  # the SLO's keys, in their canonical order
UNITS = {"ms": 1000.0, "s": 1.0}  # unit -> divisor to seconds
EXAMPLE = "ttft=500ms,tpot=50ms"
ENDED_APART = ("aborted", "failed")  # ended states that are neither met nor missed


def _ms(seconds: float) -> str:
    """A target in the canonical text, as short as exact: milliseconds below 1,000 s (``500ms``,
    ``0.5ms``, ``250000ms``), seconds above (``1000s``), never an exponent (``1e+06ms``)."""
    ms = seconds * 1000
    if ms < 1e6:
        return f"{ms:.12f}".rstrip("0").rstrip(".") + "ms"
    return f"{seconds:.12f}".rstrip("0").rstrip(".") + "s"


@dataclass(frozen=True)
class SLO:
    """Latency targets for one request (None: no target of that kind); at least one is set."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    def __post_init__(self) -> None:
        for key in TARGETS:
            v = getattr(self, f"{key}_s")
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"SLO {key} must be a time > 0, got {v!r}")
        if self.ttft_s is None and self.tpot_s is None:
            raise ValueError(f"an SLO needs a target: ttft, tpot or both (e.g. {EXAMPLE})")

    @classmethod
    def parse(cls, text: str) -> SLO:
        """``ttft=500ms,tpot=50ms`` (either or both; units ms or s). ValueError, one line, saying
        what is wrong and what is allowed."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"empty SLO: expected ttft=TIME and/or tpot=TIME, e.g. {EXAMPLE}")
        got: dict[str, float] = {}
        for part in text.split(","):
            part = part.strip()
            key, eq, value = part.partition("=")
            key, value = key.strip().lower(), value.strip()
            if not eq or not key or not value:
                raise ValueError(f"SLO part {part!r}: expected KEY=TIME with KEY ttft or tpot, e.g. {EXAMPLE}")
            if key not in TARGETS:
                raise ValueError(f"unknown SLO target {key!r}: expected ttft or tpot, e.g. {EXAMPLE}")
            if key in got:
                raise ValueError(f"SLO target {key} given twice in {text!r}: give each of ttft, tpot at most once")
            got[key] = _seconds(key, value)
        return cls(ttft_s=got.get("ttft"), tpot_s=got.get("tpot"))

    @classmethod
    def from_value(cls, value) -> SLO:
        """A workload line's ``"slo"``: the same text as --slo, or an object such as
        ``{"ttft": "500ms", "tpot": "50ms"}``. ValueError saying what is allowed."""
        if isinstance(value, str):
            return cls.parse(value)
        if isinstance(value, dict):
            if not value:
                raise ValueError(f"empty SLO: expected ttft and/or tpot, e.g. {{'ttft': '500ms'}} or {EXAMPLE!r}")
            unknown = sorted(str(k) for k in value if k not in TARGETS)
            if unknown:
                raise ValueError(f"unknown SLO target(s) {', '.join(unknown)}: expected ttft or tpot")
            bad = [k for k, v in value.items() if not isinstance(v, str)]
            if bad:
                raise ValueError(f'SLO {bad[0]}: expected a time with its unit as a string, e.g. "500ms"')
            return cls(**{f"{k}_s": _seconds(k, v.strip()) for k, v in value.items()})
        raise ValueError(f"SLO: expected a string like {EXAMPLE!r} or an object like {{'ttft': '500ms'}}")

    def __str__(self) -> str:
        parts = (f"{key}={_ms(v)}" for key in TARGETS if (v := getattr(self, f"{key}_s")) is not None)
        return ",".join(parts)


def _seconds(key: str, value: str) -> float:
    """``500ms`` / ``0.5s`` -> seconds, or a one-line ValueError naming the target."""
    unit = "ms" if value.endswith("ms") else "s" if value.endswith("s") else ""
    if not unit:
        raise ValueError(f"SLO {key}={value}: give a unit, ms or s (e.g. {key}={value}ms)")
    try:
        number = float(value[: -len(unit)])
    except ValueError:
        raise ValueError(f"SLO {key}={value}: expected a number then ms or s, e.g. {key}=500ms") from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"SLO {key}={value}: expected a time > 0")
    return number / UNITS[unit]


def tpot(first_token_s: float | None, last_token_s: float | None, tokens: int) -> float | None:
    """Time per output token after the first (vLLM's TPOT); None with fewer than 2 tokens."""
    if first_token_s is None or last_token_s is None or tokens < 2:
        return None
    return max(0.0, last_token_s - first_token_s) / (tokens - 1)


@dataclass(frozen=True)
class SLOVerdict:
    """One request against its SLO. ``state`` "finished" is judged (met, or ``missed`` naming the
    targets); "aborted" / "failed" are counted apart (never met, never missed)."""

    met: bool
    missed: tuple[str, ...] = ()  # the targets missed, of TARGETS
    reason: str = ""  # a miss: the WAIT_REASONS code it waited most ("" when met, or it never waited)
    state: str = "finished"  # how the request ended: finished, aborted or failed

    @property
    def outcome(self) -> str:
        """met, missed, aborted or failed: one word for a table or a metric label."""
        return self.state if self.state in ENDED_APART else "met" if self.met else "missed"

    @property
    def mark(self) -> str:
        """A short mark for a row: ``✓``, ``✗ ttft (pool)``, ``aborted``."""
        if self.state in ENDED_APART:
            return self.state
        if self.met:
            return "✓"
        why = f" ({self.reason})" if self.reason else ""
        return f"✗ {'+'.join(self.missed)}{why}"


def verdict_record(v: SLOVerdict, slo: SLO) -> dict:
    """A verdict as a recording stores it (with the SLO it was judged against)."""
    d: dict = {"outcome": v.outcome, "slo": str(slo)}
    if v.missed:
        d["missed"] = list(v.missed)
    if v.reason:
        d["reason"] = v.reason
    return d


def verdict_from_record(d) -> tuple[SLOVerdict, SLO]:
    """``verdict_record``'s dict back; ValueError (one line) for anything else."""
    if not isinstance(d, dict) or d.get("outcome") not in ("met", "missed", *ENDED_APART):
        raise ValueError(f"an SLO verdict must be an object with outcome met, missed, aborted or failed, got {d!r}")
    missed = d.get("missed", [])
    if not isinstance(missed, list) or any(m not in TARGETS for m in missed):
        raise ValueError(f"an SLO verdict's missed targets must be a list of ttft / tpot, got {missed!r}")
    reason = d.get("reason", "")
    if not isinstance(reason, str):
        raise ValueError(f"an SLO verdict's reason must be a string, got {reason!r}")
    outcome = d["outcome"]
    state = outcome if outcome in ENDED_APART else "finished"
    verdict = SLOVerdict(met=outcome == "met", missed=tuple(missed), reason=reason, state=state)
    return verdict, SLO.parse(d.get("slo", ""))


def most_waited(waited: Mapping[str, int] | Iterable[tuple[str, int]]) -> str:
    """The reason with the most steps waited (ties: the first given); "" when it never waited."""
    pairs = list(waited.items() if isinstance(waited, Mapping) else waited)
    best, steps = "", 0
    for code, n in pairs:
        if n > steps:
            best, steps = code, n
    return best


def judge(
    slo: SLO,
    ttft_s: float | None,
    tpot_s: float | None,
    waited: Mapping[str, int] | Iterable[tuple[str, int]] = (),
    state: str = "finished",
) -> SLOVerdict:
    """A request's verdict. No first token misses a TTFT target; fewer than two tokens (tpot_s
    None) meets a TPOT target (nothing to pace, as vLLM counts it). ``waited``: steps per
    WAIT_REASONS code, as the engine counts them (a dict or (code, steps) pairs)."""
    if state in ENDED_APART:
        return SLOVerdict(met=False, state=state)
    missed = []
    if slo.ttft_s is not None and (ttft_s is None or ttft_s > slo.ttft_s):
        missed.append("ttft")
    if slo.tpot_s is not None and tpot_s is not None and tpot_s > slo.tpot_s:
        missed.append("tpot")
    if not missed:
        return SLOVerdict(met=True)
    return SLOVerdict(met=False, missed=tuple(missed), reason=most_waited(waited))


def result_verdict(result, slo: SLO) -> SLOVerdict:
    """A finished run's request (tinyllm.request.Result: TTFT and end from its arrival, its tokens)
    against ``slo``. No wait reasons: a Result does not keep them, so a miss names none."""
    ttft = None if math.isnan(result.ttft_s) else result.ttft_s
    return judge(slo, ttft, tpot(ttft, result.latency_s, len(result.tokens)), state=result.state)


def goodput(verdicts: Iterable[SLOVerdict], span_s: float) -> float:
    """Requests per second that met their SLO over ``span_s`` (0 for an empty span)."""
    met = sum(v.met for v in verdicts)
    return met / span_s if span_s > 0 else 0.0


def share_met(verdicts: Iterable[SLOVerdict]) -> float | None:
    """Of the requests judged (finished), the share that met the SLO; None when none finished."""
    judged = [v for v in verdicts if v.state not in ENDED_APART]
    return sum(v.met for v in judged) / len(judged) if judged else None


@dataclass(frozen=True)
class SLOSummary:
    """A lane's or a run's verdicts, counted: what a table row, a counter or JSON shows."""

    met: int = 0
    missed: int = 0
    aborted: int = 0
    failed: int = 0
    span_s: float = 0.0  # the time goodput is over (a lane's finishing time, a server's uptime)
    reasons: tuple[tuple[str, int], ...] = field(default=())  # misses per reason, most first

    @classmethod
    def of(cls, verdicts: Iterable[SLOVerdict], span_s: float) -> SLOSummary:
        vs = list(verdicts)
        count = {o: sum(v.outcome == o for v in vs) for o in ("met", "missed", "aborted", "failed")}
        reasons: dict[str, int] = {}
        for v in vs:
            if v.outcome == "missed":
                reasons[v.reason or "none"] = reasons.get(v.reason or "none", 0) + 1
        ranked = tuple(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
        return cls(**count, span_s=span_s, reasons=ranked)

    @property
    def judged(self) -> int:
        return self.met + self.missed

    @property
    def goodput(self) -> float:
        """Requests/s that met the SLO."""
        return self.met / self.span_s if self.span_s > 0 else 0.0

    @property
    def share_met(self) -> float | None:
        return self.met / self.judged if self.judged else None

    def __str__(self) -> str:
        """``goodput 3.20 req/s · 8/10 met (80%) · 1 aborted``"""
        share = "" if self.share_met is None else f" ({self.share_met:.0%})"
        apart = "".join(f" · {n} {o}" for o, n in (("aborted", self.aborted), ("failed", self.failed)) if n)
        return f"goodput {self.goodput:.2f} req/s · {self.met}/{self.judged} met{share}{apart}"

    def as_dict(self) -> dict:
        """For JSON (what-if, bench): the counts, goodput and share met, misses by reason."""
        return {
            "goodput_rps": round(self.goodput, 6),
            "share_met": None if self.share_met is None else round(self.share_met, 6),
            "met": self.met,
            "missed": self.missed,
            "aborted": self.aborted,
            "failed": self.failed,
            "missed_by_reason": dict(self.reasons),
        }


# -- a live engine's requests (snapshots and timeline tracks: the app, the recording, the trace) ----


def track_waits(track, now_step: int) -> dict[str, int]:
    """Steps a request waited per reason, from its timeline track (observe/timeline.py: what the
    app, a recording and the Perfetto export rebuild from lifecycle events); {} without one."""
    out: dict[str, int] = {}
    for first, last, code in track.wait_spans(now_step) if track is not None else ():
        out[code] = out.get(code, 0) + last - first + 1
    return out


def view_verdict(view, slo: SLO | None, waited: Mapping[str, int] | Iterable[tuple[str, int]] = ()):
    """An ended request's verdict from its snapshot view (observe/snapshot.RequestView): TTFT
    from arrival to first token, TPOT from first to last token; None while it runs, or without
    an SLO."""
    if slo is None or view.state not in ("finished", *ENDED_APART):
        return None
    per_token = tpot(view.first_token_s, view.finish_s, len(view.tokens))
    return judge(slo, view.ttft_s, per_token, waited, state=str(view.state))


def snapshot_verdicts(snapshot, tracks, slo: SLO | None, own: Mapping[int, SLO] | None = None) -> dict[int, SLOVerdict]:
    """Every ended request's verdict in a snapshot (``tracks``: the frame's timeline tracks, for
    the reason a miss waited most). ``own``: request id -> its workload line's SLO, which wins
    over ``slo`` (the run's --slo)."""
    own = own or {}
    if slo is None and not own:
        return {}
    by_rid = {t.rid: t for t in tracks}
    now = snapshot.counters.steps
    out = {}
    for v in snapshot.requests:
        verdict = view_verdict(v, own.get(v.rid) or slo, track_waits(by_rid.get(v.rid), now))
        if verdict is not None:
            out[v.rid] = verdict
    return out


def snapshot_summary(snapshot, tracks, slo: SLO | None, own: Mapping[int, SLO] | None = None) -> SLOSummary | None:
    """The verdicts so far, goodput over the engine's time since the first arrival (None: no
    SLO, neither the run's nor a request's own)."""
    if slo is None and not own:
        return None
    first = min((v.arrival_s for v in snapshot.requests), default=snapshot.time_s)
    verdicts = snapshot_verdicts(snapshot, tracks, slo, own)
    return SLOSummary.of(verdicts.values(), max(0.0, snapshot.time_s - first))
