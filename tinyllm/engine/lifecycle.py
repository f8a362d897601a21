"""A request's transitions in the engine: seated in a slot, preempted, finished, failed, and
the lifecycle event each one records.

A part of ContinuousEngine (a mixin: it changes the engine's own state). The scheduler decides
who moves; these methods make a move take effect everywhere it shows (the running list, the
slot map, the cache's slots and blocks, the results, the counters, the lifecycle events).
"""

from __future__ import annotations

import math

from tinyllm.engine.sequence import Sequence
from tinyllm.observe.snapshot import LifecycleEvent, RequestState
from tinyllm.request import Result


class Lifecycle:
    """How a request moves between queued, running and ended."""

    def _preempted(self, seq: Sequence, slot: int, why: str) -> None:
        """``seq`` lost its slot and blocks (already released): back in line (fcfs: at the front),
        to be recomputed later from its context (prompt + generated so far)."""
        self._slot_seq[slot] = None
        if seq in self._running:
            self._running.remove(seq)
        seq.slot, seq.state, seq.view, seq.computed = None, "preempted", None, 0
        seq.preemptions += 1
        self.waiting.prepend(seq)
        self.stats.preemptions += 1
        self._note("preempted", seq, slot, seq.context_len(), why)

    def _seat(self, seq: Sequence, slot: int, tokens: int, why: str = "") -> None:
        """``seq`` (admitted, or forked: ``why`` says of whom) runs in ``slot`` from now on."""
        self._running.append(seq)
        self._slot_seq[slot] = seq
        seq.slot, seq.state, seq.view, seq.prefilled = slot, "running", None, False
        if seq.admitted is None:
            seq.admitted = self.now()
        self._just_admitted.add(slot)
        again = f"recompute after {seq.preemptions} preemption(s)" if seq.preemptions else ""
        self._note("admitted", seq, slot, tokens, why or again, seq.admit_cached)

    def _finished_now(self, seq: Sequence, now: float, why: str) -> None:
        """``seq`` ends finished (``why``: eos, stop, length): its Result kept, its slot freed."""
        first = seq.first_token if seq.first_token is not None else now
        self.results[seq.rid] = Result(
            list(seq.out), first - seq.arrival, now - seq.arrival, seq.rid, "finished", why, None, tuple(seq.logprobs)
        )
        self.stats.useful_tokens += len(seq.out)
        self._finished += 1
        slot = seq.slot
        if slot is not None:
            self._free_slot(seq)
        seq.end(RequestState.FINISHED, now)
        self._note("finished", seq, slot, len(seq.out), why)

    def _ended_result(self, seq: Sequence, reason: str) -> None:
        """An aborted or failed request's Result: what it generated, how it ended, when."""
        end = seq.finish if seq.finish is not None else self.now()
        ttft = seq.first_token - seq.arrival if seq.first_token is not None else math.nan
        self.results[seq.rid] = Result(
            list(seq.out), ttft, end - seq.arrival, seq.rid, seq.state, reason, seq.error, tuple(seq.logprobs)
        )

    def _fail(self, seq: Sequence, why: str) -> None:
        """Give up on one request (its slot freed, the reason kept); the others go on."""
        self._unfork(seq)
        slot = seq.slot
        if slot is not None:
            self._free_slot(seq)
        seq.error = why
        seq.end(RequestState.FAILED, self.now())
        self._ended_result(seq, "error")
        self._failed += 1
        self._note("failed", seq, slot, len(seq.out), why)

    def _note(
        self, kind: str, seq: Sequence, slot: int | None = None, tokens: int = 0, reason: str = "", cached: int = 0
    ) -> None:
        self._lifecycle.append(LifecycleEvent(kind, seq.rid, self._steps, self.now(), slot, tokens, reason, cached))

    def _free_slot(self, seq: Sequence) -> None:
        if seq in self._running:
            self._running.remove(seq)
        self._slot_seq[seq.slot] = None
        self.slots.release(seq.slot)
        seq.slot = None
