"""The seed's scheduler: admit into free slots, then decode every slot (either cache).

Each step has two passes, each planned after the engine committed the one before:

1. admissions: waiting requests, in the policy's order, go into free slots while the cache can
   hold their whole context (plus the position their first decode writes), all in one
   left-padded prefill that also samples their first token;
2. a decode of every slot: one token each, in one batch of all the slots (an idle slot computes
   a throwaway row). On the paged cache a slot whose next position needs a block when none is
   free makes the pool evict the newest running request (``BlockPool.reserve_step``); the
   engine requeues it, to be recomputed later from prompt + generated tokens.

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
            if admit.items:
                yield admit
        yield self.decode(running)

    def admissions(self, waiting: WaitingQueue) -> StepPlan:
        """As many waiting requests as fit, in order, each with the free slot it will take."""
        pool = self.pool
        free = pool.free_slots()
        batch: list[Sequence] = []
        while (waiting and len(batch) < len(free)
               and pool.can_admit([q.context_len() for q in [*batch, waiting.peek()]])):
            batch.append(waiting.pop())
        return StepPlan("prefill", [(q, 0, q.context_len()) for q in batch], slots=free[:len(batch)])

    def decode(self, running: list[Sequence]) -> StepPlan:
        """One token for every running sequence, in slot order, once the pool has room for it."""
        pool = self.pool
        evicted = pool.reserve_step()                   # paged: out of blocks -> the newest go
        holder = {q.slot: q for q in running}
        live = [s for s in range(pool.n_slots) if pool.active[s]]
        return StepPlan("decode", [(holder[s], pool.lens[s], 1) for s in live],
                        preempted=[holder[s] for s in evicted])
