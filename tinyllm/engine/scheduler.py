"""The scheduler interface (``Scheduler.plan``, ``StepPlan``) and the token-budget scheduler.

A step has one shape, nano-vllm's and vLLM V1's: ``plan = scheduler.plan(...)``, the model runs
the plan (``forward.py``), the engine commits the outcome (``continuous.py``). A scheduler decides
who runs and how many tokens each, on the pool's bookkeeping alone (slots, block tables, refcounts,
prefix keys: ``kv/blocks.py``), never on K/V tensors; the waiting queue's order is the policy's
(``policy.py``). Two schedulers implement ``plan()``: the seed's (``admission.py``) and this one.

The token-budget scheduler (chunked prefill). Each step has a budget of ``max_batched_tokens``
tokens, filled in this order:

1. every running sequence whose context is computed but for its newest token: one decode token
   each (never starved: the budget is at least one token per slot). A decode that needs a new
   KV block when none is free preempts the newest running sequence (the one admitted last), or
   itself if it is the newest: its blocks go back to the pool and it waits to be recomputed;
2. running sequences still prefilling (admitted earlier, prompt not yet all computed), oldest
   first: as many of their remaining context tokens as the budget and the free blocks allow;
3. waiting sequences (queued, or preempted and back in line), in the policy's order, into free
   slots: first the longest chain of cached full blocks that matches their context (prefix
   caching: those tokens count as computed), then their first chunk, as large as the budget and
   the free blocks allow. Not in a step that preempted (the pool is short; admitting would only
   be undone).

Before 1, a waiting request that outranks running ones (the ``priority`` policy) and finds no
slot or no room for its first chunk preempts the lowest-priority of them. Every request that
computes nothing gets the scheduler's reason (``StepPlan.waits``: WAIT_REASONS codes).

A sequence's ``computed`` counts the context tokens whose K/V is in the pool; it catches up
with the context (prompt + generated) over as many steps as it takes, and a preempted one
restarts from 0 through the same path. Like vLLM's V1 scheduler (``num_computed_tokens``
within ``max_num_batched_tokens``), speculative drafts included (engine/speculate.py). All of
a step is one forward pass: one plan.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

from tinyllm.engine.policy import WaitingQueue
from tinyllm.engine.sequence import Sequence
from tinyllm.engine.speculate import NgramProposer, Proposer
from tinyllm.kv.blocks import BlockPool

Item = tuple[Sequence, int, int]  # (seq, start, n): the sequence computes context positions start..start+n-1


@dataclass
class StepPlan:
    """One forward pass, as a scheduler planned it. ``kind`` says which forward runs it:

    - "mixed": decode tokens and prefill chunks together (the token-budget scheduler);
    - "prefill": whole contexts of requests entering slots (the seed's admissions);
    - "decode": one token for every running sequence (the seed's decode).

    All three run on one forward (``forward.py``: a ragged batch over the block pool).
    """

    kind: Literal["mixed", "prefill", "decode"] = "mixed"
    items: list[Item] = field(default_factory=list)  # batch order
    admitted: list[Sequence] = field(default_factory=list)  # got a slot from the scheduler (seq.slot set)
    slots: list[int] = field(default_factory=list)  # prefill: items[i] takes slots[i] if its prefill succeeds
    preempted: list[Sequence] = field(default_factory=list)  # lost their slot and blocks (released), newest first
    prefix_queries: int = 0  # context tokens looked up in the prefix cache (vLLM's meaning)
    prefix_hits: int = 0  # of those, tokens served from cached blocks
    waits: dict[int, tuple[str, str]] = field(default_factory=dict)  # rid -> (WAIT_REASONS code, detail):
    # why each request that computes nothing this step waits

    @property
    def tokens(self) -> int:
        return sum(n for _, _, n in self.items)

    def alone(self) -> list[StepPlan]:
        """One plan per item (a batch whose forward raised is retried item by item); what the
        plan already did (admissions, preemptions) is not repeated."""
        if self.kind == "prefill":
            return [StepPlan("prefill", [item], slots=[s]) for item, s in zip(self.items, self.slots)]
        return [StepPlan(self.kind, [item]) for item in self.items]


class Scheduler(Protocol):
    """Decides each step's forward passes. Implementations: ``TokenBudgetScheduler`` (one mixed
    pass per step), ``admission.AdmissionScheduler`` (the seed's: a prefill pass, then a decode)."""

    def plan(self, running: list[Sequence], waiting: WaitingQueue) -> Iterator[StepPlan]:
        """This step's passes, in order. The engine runs and commits each before the next is
        planned, so a later pass sees the outcome of the earlier ones (``running`` is the
        engine's live list: in admission order, newest last). A scheduler pops what it admits
        from ``waiting``, claims and releases slots and blocks in the pool's bookkeeping, and
        sets ``slot`` / ``computed`` / ``admit_cached`` (and ``cached_tokens``, once) of what it
        admits; the engine does the rest from the plan (states, lifecycle events, requeueing the preempted)."""
        ...


class TokenBudgetScheduler:
    """Chunked prefill within a token budget per step (see the module docstring)."""

    def __init__(
        self,
        pool: BlockPool,
        max_batched_tokens: int,
        spec_tokens: int = 0,
        proposer: Proposer | None = None,
        spec_off_at: int | None = None,
    ):
        self.pool = pool
        self.max_batched_tokens = max_batched_tokens
        self.spec_tokens = spec_tokens  # tokens drafted per greedy decode (engine/speculate.py); 0: off
        self.proposer: Proposer = proposer or NgramProposer()
        self.spec_off_at = spec_off_at  # no drafts in a step with this many decodes or more (None: never)
        self.spec_off_steps = 0  # steps speculation was off for the batch's size (the app says so)
        self.spec_off_now = False  # the latest step's
        self.proposer_error = ""  # why the latest proposal failed (no drafts that step); "" once one works

    def _drafts(self, decoding: list[Sequence], budget: int, skip: list[Sequence]) -> dict[int, list[int]]:
        """This step's drafts, by rid (engine/speculate.py): only for a request whose draft can be
        verified exactly (``Row.draftable``), within its max_new_tokens and its slot's context,
        asked of the proposer in one call (a draft model guesses for all of them in one batch);
        then, in order, each cut to the budget the decodes after it leave (a draft's prefix is
        the draft a smaller room would have got). A proposer that fails drafts nothing this step
        (``proposer_error`` says why): the decodes go on without."""
        asks: list[tuple[Sequence, int]] = []
        for seq in decoding:
            if seq.forks or (skip and seq in skip) or not seq.row().draftable:
                continue
            room = min(
                self.spec_tokens,
                seq.req.max_new_tokens - len(seq.out) - 1,  # (the bonus token is the last one)
                self.pool.max_len - seq.context_len() - 1,
            )
            if room > 0:
                asks.append((seq, room))
        if not asks:
            return {}
        try:
            drafts = self.proposer.propose([(seq.context(), room) for seq, room in asks])
        except Exception as e:  # noqa: BLE001 - a draft model's pass failed (e.g. out of memory)
            self.proposer_error = f"{type(e).__name__}: {e}"
            return {}
        self.proposer_error = ""
        out, spare = {}, budget - len(decoding)  # (every decode keeps its own token)
        for (seq, _), draft in zip(asks, drafts, strict=True):
            draft = draft[: max(0, spare)]
            if draft:
                out[seq.rid] = draft
                spare -= len(draft)
        return out

    def plan(self, running: list[Sequence], waiting: WaitingQueue) -> Iterator[StepPlan]:
        yield self.plan_step(running, waiting)

    def plan_step(self, running: list[Sequence], waiting: WaitingQueue) -> StepPlan:
        """Decide this step; allocates the blocks it schedules and releases the preempted ones."""
        pool, plan = self.pool, StepPlan()
        free_slots = pool.free_slots()
        budget = self.max_batched_tokens
        live = list(running)  # running minus this step's victims
        scheduled: set[int] = set()
        self._make_room(live, waiting, plan, free_slots)  # 0. priority: push out lower priority
        short = False  # preempted for want of blocks this step
        decoding = waiting.running_order([s for s in running if s.remaining() == 1])
        speculate = self.spec_tokens > 0 and (self.spec_off_at is None or len(decoding) < self.spec_off_at)
        self.spec_off_now = bool(self.spec_tokens and not speculate and decoding)
        if self.spec_off_now:
            self.spec_off_steps += 1  # a batch this large has no spare compute to verify drafts with
        drafts = self._drafts(decoding, budget, plan.preempted) if speculate else {}
        for seq in decoding:  # 1. decodes (with a speculative draft where one is found)
            if plan.preempted and seq in plan.preempted:  # (a list scan only after a preemption)
                continue
            draft = drafts.get(seq.rid, [])
            if draft and not pool.try_grow(seq.slot, seq.computed + 1 + len(draft)):
                draft = []  # no blocks for it: a plain decode
            seq.draft = draft
            while not pool.try_grow(seq.slot, seq.computed + 1):
                victim = waiting.victim([s for s in live if s.rid not in scheduled])  # maybe seq
                self._preempt(
                    victim,
                    live,
                    plan,
                    free_slots,
                    f"out of KV blocks: #{seq.rid}'s next token needed a block, none free",
                )
                short = True
                if victim is seq:
                    break
            else:
                n = 1 + len(seq.draft)
                plan.items.append((seq, seq.computed, n))
                waiting.charge(seq, n)
                scheduled.add(seq.rid)
                budget -= n
        blocked: tuple[str, str] | None = None  # why the head of the queue waits
        while True:
            for seq in live:  # 2. prefills in progress
                if budget <= 0:
                    break
                if seq.rid in scheduled:
                    continue
                n = min(seq.remaining(), budget, pool.room(seq.slot))
                if n > 0:
                    pool.try_grow(seq.slot, seq.computed + n)
                    plan.items.append((seq, seq.computed, n))
                    waiting.charge(seq, n)
                    scheduled.add(seq.rid)
                    budget -= n
            while waiting:  # 3. admissions
                blocked = self._blocked(free_slots, budget, short)
                if blocked:
                    break
                seq, slot = waiting.peek(), free_slots[0]
                context = seq.context()
                hit = pool.match_prefix(context)  # cached full blocks: not computed again
                cached = len(hit) * pool.block_size
                room = pool.room_fresh() - pool.free_blocks_taken_by(hit) * pool.block_size
                n = min(len(context) - cached, budget, room)
                if n <= 0:
                    blocked = self._pool_full(len(context) - cached, budget, max(0, room) // pool.block_size)
                    break
                waiting.pop()
                free_slots.pop(0)
                pool.activate(slot)
                pool.take_prefix(slot, hit)
                pool.try_grow(slot, cached + n)
                seq.slot, seq.computed, seq.admit_cached = slot, cached, cached
                if seq.admitted is None:  # OpenAI's cached_tokens: the prompt's, once (after a
                    seq.cached_tokens = cached  # preemption the context holds its output too)
                plan.prefix_queries += len(context)
                plan.prefix_hits += cached
                live.append(seq)
                plan.admitted.append(seq)
                plan.items.append((seq, cached, n))
                waiting.charge(seq, n)  # as planned: the next pick sees it
                scheduled.add(seq.rid)
                budget -= n
            if plan.items or not live:
                break
            # Every running sequence is mid-prefill and the pool is full: nobody can move. Free the
            # newest one's blocks so the others can (a sequence always fits the pool alone).
            self._preempt(
                live[-1],
                live,
                plan,
                free_slots,
                "out of KV blocks: every running request was mid-prefill and the pool was full; the newest made way",
            )
            short = True
        plan.items.sort(key=lambda item: item[2] != 1)  # one-token items first (stable: decodes lead)
        self._explain(live, scheduled, waiting, blocked, budget, plan)
        return plan

    def _blocked(self, free_slots: list[int], budget: int, short: bool) -> tuple[str, str] | None:
        """Why the queue's head cannot be admitted this step before looking at its blocks."""
        if short:
            return "pool", "KV pool short: a running request was just preempted for blocks"
        if not free_slots:
            n = self.pool.n_slots
            return "slots", f"all {n} slots busy (max running sequences: {n})"
        if budget <= 0:
            b = self.max_batched_tokens
            return "budget", f"this step's token budget is used up ({b}/{b} tokens)"
        return None

    def _pool_full(self, uncached: int, budget: int, free: int | None = None) -> tuple[str, str]:
        """The head's first chunk finds no room: how many blocks it needs, how many it could take
        (``free``: free blocks less those holding its own cached prefix, which it revives)."""
        bs = self.pool.block_size
        need = -(-min(uncached, max(budget, 1)) // bs)
        free = self.pool.num_free_blocks() if free is None else free
        return "pool", f"KV pool full: needs {need} block{'s' * (need != 1)}, {free} free"

    def _make_room(self, live: list[Sequence], waiting: WaitingQueue, plan: StepPlan, free_slots: list[int]) -> None:
        """Preempt running requests the queue's head outranks (the ``priority`` policy) while it
        finds no free slot or no room for its first chunk."""
        pool = self.pool
        while waiting:
            head = waiting.peek()
            lower = [s for s in live if waiting.outranks(head, s)]
            if not lower:  # (fcfs & co: never; so no prefix lookup)
                return
            if free_slots:
                hit = pool.match_prefix(head.context())
                room = pool.room_fresh() - pool.free_blocks_taken_by(hit) * pool.block_size
                if room >= min(head.context_len() - len(hit) * pool.block_size, self.max_batched_tokens):
                    return
            victim = waiting.victim(lower)
            self._preempt(
                victim,
                live,
                plan,
                free_slots,
                f"for #{head.rid}, of higher priority ({head.req.priority} < {victim.req.priority})",
            )

    def _explain(
        self,
        live: list[Sequence],
        scheduled: set[int],
        waiting: WaitingQueue,
        blocked: tuple[str, str] | None,
        budget: int,
        plan: StepPlan,
    ) -> None:
        """A reason for every request that computes nothing this step (``plan.waits``)."""
        for seq in live:
            if seq.rid not in scheduled:  # admitted, mid-prefill, no chunk this step
                plan.waits[seq.rid] = self._blocked([0], budget, False) or self._pool_full(seq.remaining(), budget)
        for i, seq in enumerate(waiting):
            if i == 0:
                plan.waits[seq.rid] = blocked or ("queue", "next in line")
            else:
                plan.waits[seq.rid] = "queue", f"behind {i} earlier request{'s' * (i != 1)} in {waiting.name} order"

    def _preempt(self, seq: Sequence, live: list[Sequence], plan: StepPlan, free_slots: list[int], why: str) -> None:
        seq.draft = []
        self.pool.release(seq.slot)
        free_slots.append(seq.slot)
        free_slots.sort()
        live.remove(seq)
        plan.preempted.append(seq)
        plan.waits[seq.rid] = "preempted", why
