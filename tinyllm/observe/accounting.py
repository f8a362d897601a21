"""One request's accounting: where its time went (queue, prefill, decode) and what it cost.

One definition for every place that shows it (the server's responses, the app's request pane),
with vLLM's phase boundaries (``vllm/v1/metrics/stats.py``): queue = arrival to first admission
(vLLM's queued → scheduled), prefill = first admission to first token, decode = first token to
the last token; time lost to preemptions stays inside the phase it interrupted, and their count
is said apart. Times are on the engine clock, in seconds; the figures are milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tinyllm.observe.snapshot import ENDED_STATES

if TYPE_CHECKING:
    from tinyllm.observe.snapshot import LifecycleEvent, RequestView


def _ms(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(max(0.0, end - start) * 1000, 3)


@dataclass(frozen=True)
class Accounting:
    """A request's figures; a phase not reached (yet) is None."""

    queue_ms: float | None
    prefill_ms: float | None
    decode_ms: float | None
    e2e_ms: float | None
    preemptions: int
    cached_tokens: int

    @classmethod
    def of(
        cls,
        arrival: float | None,
        admitted: float | None,
        first_token: float | None,
        end: float | None,
        preemptions: int,
        cached_tokens: int,
    ) -> Accounting:
        """From the phase boundaries; ``end``: the last token (or now, for a running request)."""
        return cls(
            _ms(arrival, admitted),
            _ms(admitted, first_token),
            _ms(first_token, end),
            _ms(arrival, end),
            preemptions,
            cached_tokens,
        )

    @classmethod
    def of_view(cls, v: RequestView, now_s: float) -> Accounting:
        """A snapshot's request; a phase still going is counted up to ``now_s``."""
        end = v.finish_s if v.finish_s is not None else now_s
        admitted, first = v.admitted_s, v.first_token_s
        if admitted is None and first is None:  # never admitted: all of it was queueing
            return cls(_ms(v.arrival_s, end), None, None, _ms(v.arrival_s, end), v.preemptions, v.cached_tokens)
        return cls(
            _ms(v.arrival_s, admitted),
            _ms(admitted, first if first is not None else end),
            _ms(first, end),
            _ms(v.arrival_s, end),
            v.preemptions,
            v.cached_tokens,
        )

    def as_dict(self) -> dict:
        """The ``"tinyllm"`` field of a server response."""
        return {
            "queue_ms": self.queue_ms,
            "prefill_ms": self.prefill_ms,
            "decode_ms": self.decode_ms,
            "e2e_ms": self.e2e_ms,
            "preemptions": self.preemptions,
            "cached_tokens": self.cached_tokens,
        }


@dataclass
class RequestTimes:
    """A request's phase boundaries, collected from its lifecycle events as they happen (the
    server's engine thread feeds one per request)."""

    arrival: float | None = None
    admitted: float | None = None  # the first admission (a re-admission after preemption is not)
    first_token: float | None = None
    end: float | None = None  # finished (its last token), aborted or failed
    preemptions: int = 0
    cached_tokens: int = 0  # of its prompt, at its first admission (OpenAI's usage)

    def on_event(self, ev: LifecycleEvent) -> None:
        kind = ev.kind
        if kind == "queued":
            self.arrival = ev.time_s
        elif kind == "admitted":
            if self.admitted is None:  # (a recompute's hit counts its output too)
                self.admitted, self.cached_tokens = ev.time_s, ev.cached
        elif kind == "first_token":
            self.first_token = ev.time_s
        elif kind == "preempted":
            self.preemptions += 1
        elif kind in ENDED_STATES:
            self.end = ev.time_s

    def accounting(self) -> Accounting:
        return Accounting.of(
            self.arrival, self.admitted, self.first_token, self.end, self.preemptions, self.cached_tokens
        )
