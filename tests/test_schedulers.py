"""One scheduler interface (issue 21): the seed's and the token-budget scheduler are two
implementations of ``plan()``, both consult the one waiting-queue policy object, both plan on
block bookkeeping alone (no tensors), and a scheduler written against the interface alone plugs
into the engine and keeps greedy == solo."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.helpers import mixed_workload, random_model, run_checked, solo_outputs, with_early_eos
from tinyllm.engine import ContinuousEngine, Request
from tinyllm.engine.admission import AdmissionScheduler
from tinyllm.engine.policy import FCFSQueue, waiting_queue
from tinyllm.engine.scheduler import StepPlan, TokenBudgetScheduler
from tinyllm.engine.sequence import Sequence
from tinyllm.kv.blocks import BlockPool
from tinyllm.request import Sampling

CONFIGS = {
    "slots": dict(kv="slots"),
    "paged": dict(kv="paged", block_size=4, kv_blocks=14),
    "chunked": dict(kv="paged", block_size=4, kv_blocks=14, chunked_prefill=True, max_batched_tokens=8),
}


@pytest.fixture(scope="module")
def model():
    return random_model(seed=5, vocab=64, d_model=32, n_layers=2, max_seq_len=64)


@pytest.fixture(scope="module")
def workload(model):
    reqs = with_early_eos(model, mixed_workload(10, seed=2, vocab=64, max_prompt=30, max_new=20))
    return reqs, solo_outputs(model, reqs)


class SpyQueue(FCFSQueue):
    """fcfs, counting what the schedulers and the engine ask of it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def __getattribute__(self, name: str):
        if name in ("add", "prepend", "peek", "pop", "remove"):
            calls = object.__getattribute__(self, "calls")
            calls[name] = calls.get(name, 0) + 1
        return object.__getattribute__(self, name)


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_both_schedulers_admit_through_the_one_policy_object(model, workload, kind):
    reqs, solo = workload
    eng = ContinuousEngine(model, 3, max_len=64, **CONFIGS[kind])
    assert isinstance(eng.waiting, FCFSQueue) and isinstance(
        eng.scheduler, TokenBudgetScheduler if kind == "chunked" else AdmissionScheduler
    )
    eng.waiting = spy = SpyQueue()
    assert run_checked(eng, reqs) == solo
    assert spy.calls["add"] == len(reqs)
    assert spy.calls["pop"] == len(reqs) + spy.calls.get("prepend", 0)  # every admission came from it
    assert spy.calls["peek"] >= spy.calls["pop"]
    if kind != "slots":
        assert spy.calls.get("prepend", 0) == eng.stats.preemptions > 0  # the pool is small: it preempts


def test_the_policy_is_chosen_by_name():
    assert isinstance(waiting_queue("fcfs"), FCFSQueue)
    with pytest.raises(ValueError, match="scheduling policy must be one of"):
        waiting_queue("lottery")


def seqs(*lens: int) -> list[Sequence]:
    return [Sequence(i, Request(list(range(1, n + 1)), 4), Sampling(), 0.0) for i, n in enumerate(lens)]


def waiting_pool(n_slots: int, *lens: int):
    """A bare BlockPool (4 blocks of 4 tokens, no K/V tensors) and an fcfs queue of sequences."""
    pool = BlockPool(n_slots=n_slots, n_blocks=4, block_size=4, max_len=16)
    waiting = waiting_queue()
    queued = seqs(*lens)
    for q in queued:
        waiting.add(q)
    return pool, waiting, queued


def test_the_token_budget_scheduler_plans_on_bookkeeping_alone():
    """A bare BlockPool (no K/V tensors) is all a plan needs."""
    pool, waiting, (a, b, c) = waiting_pool(2, 6, 5, 3)
    (plan,) = TokenBudgetScheduler(pool, max_batched_tokens=8).plan([], waiting)
    assert plan.kind == "mixed" and plan.admitted == [a, b]
    assert [(q.rid, start, n) for q, start, n in plan.items] == [(0, 0, 6), (1, 0, 2)]
    assert pool.tables == [[0, 1], [2]] and (a.slot, b.slot) == (0, 1)
    assert list(waiting) == [c]


def test_the_seed_scheduler_plans_on_bookkeeping_alone():
    pool, waiting, (a, b, c) = waiting_pool(3, 6, 5, 3)
    plan = next(AdmissionScheduler(pool).plan([], waiting))
    assert plan.kind == "prefill" and plan.slots == [0, 1]  # 2 + 2 blocks: c does not fit too
    assert [(q.rid, start, n) for q, start, n in plan.items] == [(0, 0, 6), (1, 0, 5)]
    assert list(waiting) == [c] and not any(pool.active)  # slots are taken when the prefill commits


def test_block_bookkeeping_needs_no_torch():
    code = "import sys, tinyllm.kv.blocks; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


class OneAtATime:
    """A scheduler written against the interface alone: one request at a time, its whole context
    in one chunk, then its decodes (the pool must hold the longest request)."""

    def __init__(self, pool: BlockPool):
        self.pool = pool

    def plan(self, running: list[Sequence], waiting) -> Iterator[StepPlan]:
        plan = StepPlan("mixed")
        if not running and waiting:
            seq = waiting.pop()
            seq.slot, seq.computed = self.pool.free_slots()[0], 0
            self.pool.activate(seq.slot)
            plan.admitted.append(seq)
            running = [seq]
        for seq in running:
            assert self.pool.try_grow(seq.slot, seq.computed + seq.remaining())
            plan.items.append((seq, seq.computed, seq.remaining()))
        yield plan


def test_a_new_scheduler_plugs_into_the_engine(model, workload):
    reqs, solo = workload
    eng = ContinuousEngine(model, 2, max_len=64, kv="paged", block_size=4, chunked_prefill=True)
    eng.scheduler = OneAtATime(eng.slots)
    assert run_checked(eng, reqs) == solo
    events = eng.pop_lifecycle()
    assert [e.kind for e in events if e.rid == 0][:4] == ["queued", "admitted", "prefill", "first_token"]
    assert eng.snapshot().counters.peak_active == 1 and eng.stats.preemptions == 0
