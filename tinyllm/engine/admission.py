"""The seed's scheduler: admit into free slots, then decode every slot (either cache).

Each step has two passes, each planned after the engine committed the one before:

1. admissions: waiting requests, in the policy's order, go into free slots while the cache can
   hold their whole context (plus the position their first decode writes), all in one prefill
   pass that also samples their first token;
2. a decode of every running sequence: one token each, in one batch (only the running ones: an
   idle slot computes nothing, except on the CUDA-graph path's dense slots). On the paged cache a
   slot whose next position needs a block when none is free makes the pool evict the policy's
   victim (the same rule as the token-budget scheduler's: ``WaitingQueue.victim``; fcfs: the
   newest); the engine requeues it, to be recomputed later from prompt + generated tokens.

The decode is planned after the admissions commit because what they freed counts: a newcomer
that finished (or failed) on its first token gave its blocks back before anyone is preempted.
"""

from __future__ import annotations

from collections.abc import Iterator

from tinyllm.engine.policy import WaitingQueue
from tinyllm.engine.scheduler import StepPlan
from tinyllm.engine.sequence import Sequence
from tinyllm.kv.blocks import BlockPool
from tinyllm.kv.dense import SlotKVCache


class AdmissionScheduler:
    """Prefill-then-decode over the cache's slots (see the module docstring)."""

    def __init__(self, pool: SlotKVCache | BlockPool):
        self.pool = pool

    def plan(self, running: list[Sequence], waiting: WaitingQueue) -> Iterator[StepPlan]:
        if waiting:
            admit = self.admissions(waiting)
            if admit.items or admit.waits:
                yield admit
        decode = self.decode(running, waiting)
        for seq, _, n in decode.items:
            waiting.charge(seq, n)
        yield decode

    def admissions(self, waiting: WaitingQueue) -> StepPlan:
        """As many waiting requests as fit, in order, each with the free slot it will take."""
        pool = self.pool
        free = pool.free_slots()
        batch: list[Sequence] = []
        blocked = None
        while waiting:
            if len(batch) >= len(free):
                blocked = "slots", f"all {pool.n_slots} slots busy (max running sequences: {pool.n_slots})"
                break
            if not pool.can_admit([q.context_len() for q in [*batch, waiting.peek()]]):
                blocked = "pool", f"KV pool full: its context ({waiting.peek().context_len()} tokens) does not fit"
                break
            batch.append(waiting.pop())
            waiting.charge(batch[-1], batch[-1].context_len())  # as planned: the next pick sees it
        plan = StepPlan("prefill", [(q, 0, q.context_len()) for q in batch], slots=free[: len(batch)])
        for i, q in enumerate(waiting):
            plan.waits[q.rid] = (
                blocked
                if i == 0 and blocked
                else ("queue", f"behind {i} earlier request{'s' * (i != 1)} in {waiting.name} order")
            )
        return plan

    def decode(self, running: list[Sequence], waiting: WaitingQueue) -> StepPlan:
        """One token for every running sequence, in slot order, once the pool has room for it.
        Paged: while blocks are short, the policy's victim is preempted (``waiting.victim``:
        the token-budget scheduler's rule too; fcfs picks the newest, priority the lowest)."""
        pool = self.pool
        holder = {q.slot: q for q in running}

        def victim(slots: list[int]) -> int:  # slots: the active ones, admission order
            return waiting.victim([holder[s] for s in slots]).slot

        evicted = pool.reserve_step(victim)
        live = [s for s in range(pool.n_slots) if pool.active[s]]
        plan = StepPlan("decode", [(holder[s], pool.lens[s], 1) for s in live], preempted=[holder[s] for s in evicted])
        for q in plan.preempted:
            plan.waits[q.rid] = "preempted", f"out of KV blocks: made way ({waiting.name}'s choice of whom to preempt)"
        return plan
