"""Scheduling policies (issue 23): each one's order on hand-made schedules, priority preemption,
the fair policy's bound, the scheduler's reason for every request that waits, and the hidden
invariants (greedy == solo, no leaks) under every policy and both schedulers."""

from __future__ import annotations

import functools
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import check_invariants, chunked_engine, mixed_workload, random_model, run_checked, solo_outputs
from tests.test_paged import op  # noqa: F401  (loads the shared hypothesis profile)
from tinyllm.engine import ContinuousEngine, Request
from tinyllm.engine.policy import FairQueue, waiting_queue
from tinyllm.engine.sequence import Sequence
from tinyllm.engine.solo import generate
from tinyllm.observe.snapshot import WAIT_REASONS
from tinyllm.request import SCHEDULING_POLICIES, Sampling


@pytest.fixture(scope="module")
def model():
    return random_model(seed=5, vocab=64, d_model=32, n_layers=2, max_seq_len=64)


def seq(rid: int, prompt: int = 4, new: int = 4, priority: int = 0, tenant: str = "", arrival: float | None = None):
    return Sequence(
        rid,
        Request(list(range(1, prompt + 1)), new, priority=priority, tenant=tenant),
        Sampling(),
        float(rid) if arrival is None else arrival,
    )


def drain(q) -> list[int]:
    out = []
    while q:
        out.append(q.pop().rid)
    return out


# -- each policy's order, on the queue alone --------------------------------------------------------
def test_fcfs_admits_in_arrival_order_and_a_preempted_request_goes_first():
    q = waiting_queue("fcfs")
    for s in (seq(0), seq(1), seq(2)):
        q.add(s)
    q.prepend(seq(9))
    assert [s.rid for s in q] == [9, 0, 1, 2] == drain(q)
    assert waiting_queue("fcfs").victim([seq(0), seq(1), seq(2)]).rid == 2  # the newest admitted


def test_priority_admits_lower_values_first_ties_by_arrival():
    q = waiting_queue("priority")
    for s in (seq(0, priority=5), seq(1, priority=-1), seq(2, priority=5), seq(3, priority=0)):
        q.add(s)
    q.prepend(seq(4, priority=5, arrival=0.5))  # preempted: back at its priority's place, by arrival
    assert [s.rid for s in q] == [1, 3, 0, 4, 2] == drain(q)
    running = [seq(0, priority=1), seq(1, priority=3), seq(2, priority=3)]
    assert q.victim(running).rid == 2  # the lowest priority, latest arrival among equals
    assert q.outranks(seq(7, priority=0), running[0]) and not q.outranks(seq(7, priority=1), running[0])


def test_shortest_first_admits_the_smallest_job_first():
    q = waiting_queue("shortest-first")
    for s in (seq(0, prompt=20, new=20), seq(1, prompt=2, new=30), seq(2, prompt=5, new=5), seq(3, prompt=5, new=5)):
        q.add(s)
    assert [s.rid for s in q] == [2, 3, 1, 0] == drain(q)


def test_fair_alternates_tenants_by_tokens_served_and_gives_no_credit_for_idling():
    q = FairQueue()
    for i in range(4):
        q.add(seq(i, tenant="batch"))
    q.charge(seq(0, tenant="batch"), 100)  # batch was served 100 tokens already
    q.add(seq(10, tenant="chat"))  # chat joins: lifted to the least backlogged (100)
    assert q.served["chat"] == 100
    assert q.pop().rid == 0  # tie at 100: the earlier head goes first
    q.charge(seq(0, tenant="batch"), 8)
    assert q.pop().rid == 10  # chat has 100 < 108
    q.charge(seq(10, tenant="chat"), 50)
    assert [s.rid for s in q] == [1, 2, 3] == drain(q)  # only batch waits
    q.add(seq(11, tenant="chat"))  # chat idled meanwhile: no credit saved up
    assert q.served["chat"] == 150


def test_fair_gives_no_credit_to_a_tenant_that_joins_an_empty_queue():
    q = FairQueue()
    q.add(seq(0, tenant="A"))
    q.charge(q.pop(), 100_000)  # A ran alone for a long time
    q.add(seq(1, tenant="B"))  # B arrives to an empty queue
    q.add(seq(2, tenant="A"))
    assert q.served == {"A": 100_000, "B": 100_000}
    assert [s.rid for s in q] == [1, 2]  # level: the earlier head first


def test_fair_shares_one_steps_free_slots_between_tenants():
    """Charged as planned: four free slots and two tenants waiting go two and two, not four to one."""
    from tinyllm.engine.scheduler import TokenBudgetScheduler
    from tinyllm.kv.blocks import BlockPool

    pool = BlockPool(n_slots=4, n_blocks=64, block_size=4, max_len=64)
    q = FairQueue()
    for i in range(8):
        q.add(seq(i, prompt=3, tenant="A" if i < 4 else "B"))
    plan = TokenBudgetScheduler(pool, 64).plan_step([], q)
    assert sorted(s.req.tenant for s in plan.admitted) == ["A", "A", "B", "B"]


def test_priority_preempts_the_lower_priority_decode_not_the_higher_one(model):
    """The pool runs short during the decodes: the victim is the lowest priority running request,
    even when it was admitted first (decodes are planned most important first)."""
    eng = chunked_engine(
        model, 2, 24, block_size=4, budget=32, kv_blocks=4, prefix_cache=False, scheduling_policy="priority"
    )
    low = eng.add_request(Request([1] * 6, 10, priority=1))
    eng.step()
    high = eng.add_request(Request([2] * 6, 10, priority=0))
    pre = []
    while eng.has_work():
        eng.step()
        pre += [e.rid for e in eng.pop_lifecycle() if e.kind == "preempted"]
        check_invariants(eng)
    assert pre and set(pre) == {low}, pre
    assert eng.results[high].tokens == generate(model, [2] * 6, 10)


@pytest.mark.parametrize("policy, victim", [("priority", "low"), ("fcfs", "newest")])
def test_the_prefill_then_decode_scheduler_preempts_the_policys_victim(model, policy, victim):
    """One preemption rule for both schedulers: without chunked prefill the pool running short
    asks the policy too. The low-priority request is admitted last (the newest), so fcfs evicts
    it; then admitted first, where priority still evicts it and fcfs evicts the newest."""
    for low_first in (False, True):
        eng = ContinuousEngine(model, 2, max_len=24, kv="paged", block_size=4, kv_blocks=5, scheduling_policy=policy)
        first = eng.add_request(Request([1] * 6, 12, priority=1 if low_first else 0))
        eng.step()
        second = eng.add_request(Request([2] * 6, 12, priority=0 if low_first else 1))
        low, newest = (first if low_first else second), second
        pre = []
        while eng.has_work():
            eng.step()
            pre += [e.rid for e in eng.pop_lifecycle() if e.kind == "preempted"]
            check_invariants(eng)
        assert pre and pre[0] == (low if victim == "low" else newest), (policy, low_first, pre)
        assert eng.results[first].tokens == generate(model, [1] * 6, 12)
        assert eng.results[second].tokens == generate(model, [2] * 6, 12)


def test_an_unknown_policy_is_refused_by_name(model):
    with pytest.raises(ValueError, match="scheduling policy must be one of fcfs, priority, shortest-first, fair"):
        ContinuousEngine(model, 2, scheduling_policy="lifo")


# -- the engine under each policy ---------------------------------------------------------------------
CONFIGS = {
    "slots": dict(kv="slots"),
    "paged": dict(kv="paged", block_size=4, kv_blocks=14),
    "chunked": dict(kv="paged", block_size=4, kv_blocks=14, chunked_prefill=True, max_batched_tokens=8),
}


@pytest.mark.parametrize("policy", SCHEDULING_POLICIES)
@pytest.mark.parametrize("kind", list(CONFIGS))
def test_greedy_equals_solo_and_nothing_leaks_under_every_policy(model, kind, policy):
    reqs = mixed_workload(10, seed=3, vocab=64, max_prompt=30, max_new=20)
    reqs = [Request(r.prompt, r.max_new_tokens, priority=i % 3, tenant="ab"[i % 2]) for i, r in enumerate(reqs)]
    eng = ContinuousEngine(model, 3, max_len=64, scheduling_policy=policy, **CONFIGS[kind])
    assert run_checked(eng, reqs) == solo_outputs(model, reqs)
    assert eng.snapshot().policy == policy


def order_of_admission(eng: ContinuousEngine) -> list[int]:
    while eng.has_work():
        eng.step()
    return [e.rid for e in eng.pop_lifecycle() if e.kind == "admitted"]


@pytest.mark.parametrize(
    "policy, expected", [("fcfs", [0, 1, 2, 3]), ("priority", [3, 0, 2, 1]), ("shortest-first", [2, 3, 0, 1])]
)
def test_one_slot_admits_in_the_policys_order(model, policy, expected):
    eng = chunked_engine(model, 1, 64, block_size=4, budget=32, scheduling_policy=policy)
    eng.add_request(Request([1] * 8, 2, priority=1))
    eng.add_request(Request([2] * 20, 9, priority=2))  # the longest job, lowest priority
    eng.add_request(Request([3] * 4, 2, priority=1))
    eng.add_request(Request([4] * 6, 3, priority=0))
    assert order_of_admission(eng) == expected


def test_priority_preempts_a_running_lower_priority_request_and_says_why(model):
    eng = chunked_engine(model, 1, 64, block_size=4, budget=32, scheduling_policy="priority")
    low = eng.add_request(Request([1] * 8, 20, priority=5))
    eng.step()
    eng.step()
    high = eng.add_request(Request([2] * 8, 3, priority=0))
    eng.step()
    life = eng.pop_lifecycle()
    pre = [e for e in life if e.kind == "preempted"]
    assert [e.rid for e in pre] == [low] and f"for #{high}, of higher priority (0 < 5)" in pre[0].reason
    snap = eng.snapshot()
    assert snap.request(high).state == "running" and snap.request(low).wait == "preempted"
    assert dict(snap.batch) == {high: 8}
    out = order_of_admission(eng)
    assert out == [low]  # back in once the high one finished
    solo = generate(model, [1] * 8, 20)
    assert eng.results[low].tokens == solo  # recomputed: the same greedy tokens


def test_fcfs_never_preempts_for_a_newcomer(model):
    eng = chunked_engine(model, 1, 64, block_size=4, budget=32, scheduling_policy="fcfs")
    eng.add_request(Request([1] * 8, 20, priority=5))
    eng.step()
    eng.add_request(Request([2] * 8, 3, priority=0))
    while eng.has_work():
        eng.step()
    assert eng.stats.preemptions == 0


@functools.cache
def _job(i: int) -> Request:
    return Request([1 + i % 50] * (4 + i % 9), 6 + i % 7, tenant="batch" if i < 30 else "chat")


def served_gap(policy: str, model) -> tuple[int, int]:
    """Run 30 batch requests then 10 chat ones (all at t=0) on 2 slots; the largest gap between the
    two tenants' tokens served while both wait, and the bound the fair policy promises."""
    eng = chunked_engine(model, 2, 64, block_size=4, budget=16, scheduling_policy=policy)
    reqs = [_job(i) for i in range(40)]
    for r in reqs:
        eng.add_request(r)
    served = {"batch": 0, "chat": 0}
    gap = 0
    while eng.has_work():
        eng.step()
        for rid, n in eng.snapshot().batch:
            served[reqs[rid].tenant] += n
        waiting = {reqs[rid].tenant for rid in eng.snapshot().queue}
        if waiting == {"batch", "chat"}:
            gap = max(gap, abs(served["batch"] - served["chat"]))
    bound = 2 * max(len(r.prompt) + r.max_new_tokens for r in reqs) + 16
    return gap, bound


def test_fair_keeps_two_waiting_tenants_within_its_stated_bound_and_fcfs_does_not(model):
    gap, bound = served_gap("fair", model)
    assert gap <= bound
    gap_fcfs, _ = served_gap("fcfs", model)
    assert gap_fcfs > bound  # the test can fail: fcfs serves batch first


# -- why each request waits --------------------------------------------------------------------------
def waits(eng: ContinuousEngine) -> dict[int, tuple[str, str]]:
    return {
        v.rid: (v.wait, v.wait_detail)
        for v in eng.snapshot().requests
        if v.state not in ("finished", "aborted", "failed")
    }


def first_step_waits(eng: ContinuousEngine, *prompts: list[int], new: int) -> tuple[list[int], list[tuple[str, str]]]:
    """Add a request of ``new`` tokens for each prompt, take one step: their ids, and why each waits."""
    rids = [eng.add_request(Request(p, new)) for p in prompts]
    eng.step()
    w = waits(eng)
    return rids, [w[rid] for rid in rids]


def test_a_request_blocked_by_a_full_pool_says_so(model):
    # 5 blocks of 4 tokens; the first request holds all of them, the second needs 3 for its prompt.
    eng = chunked_engine(model, 2, 20, block_size=4, budget=32, kv_blocks=5, prefix_cache=False)
    (a, _), w = first_step_waits(eng, [1] * 18, [2] * 10, new=2)
    assert w == [("", ""), ("pool", "KV pool full: needs 3 blocks, 0 free")]
    assert dict(eng.snapshot().batch) == {a: 18}
    assert eng.pop_lifecycle()[-1].reason == "pool: KV pool full: needs 3 blocks, 0 free"


def test_a_request_blocked_by_the_budget_says_so_and_the_next_one_is_behind_it(model):
    eng = ContinuousEngine(model, 3, max_len=64, kv="paged", block_size=4, chunked_prefill=True, max_batched_tokens=8)
    (a, b, _), w = first_step_waits(eng, [1] * 20, [2] * 5, [3] * 5, new=2)
    assert w == [
        ("", ""),
        ("budget", "this step's token budget is used up (8/8 tokens)"),
        ("queue", "behind 1 earlier request in fcfs order"),
    ]
    eng.step()  # a still prefills: 8 more of its 20
    assert waits(eng)[b][0] == "budget"
    assert eng.snapshot().request(a).wait == ""


def test_a_request_blocked_by_busy_slots_says_so_in_both_schedulers(model):
    for kw in (dict(kv="slots"), dict(kv="paged", chunked_prefill=True, max_batched_tokens=64)):
        eng = ContinuousEngine(model, 1, max_len=64, **kw)
        (_, b), w = first_step_waits(eng, [1] * 5, [2] * 5, new=4)
        assert w == [("", ""), ("slots", "all 1 slots busy (max running sequences: 1)")], kw
        while eng.has_work():
            eng.step()
        v = eng.snapshot().request(b)
        assert v.wait == "" and v.state == "finished"


def test_a_preempted_request_says_why_and_the_trace_of_reasons_is_in_the_lifecycle(model):
    eng = chunked_engine(model, 2, 40, block_size=4, budget=64, kv_blocks=10, prefix_cache=False)
    eng.add_request(Request([1] * 12, 20))
    eng.add_request(Request([2] * 12, 20))
    reasons = []
    while eng.has_work():
        eng.step()
        reasons += [(e.kind, e.reason) for e in eng.pop_lifecycle() if e.kind in ("preempted", "waiting")]
        check_invariants(eng)
    assert any(k == "preempted" and r.startswith("out of KV blocks") for k, r in reasons)
    assert all(r == "" or r.split(":")[0] in WAIT_REASONS for k, r in reasons if k == "waiting")


# -- the hidden invariants, every policy, random schedules --------------------------------------------
_small = random_model(seed=1, vocab=48, d_model=32, n_layers=1, max_seq_len=64)


@functools.cache
def _solo(prompt: tuple, new: int) -> list[int]:
    return generate(_small, list(prompt), new)


job = st.tuples(
    st.lists(st.integers(0, 47), min_size=1, max_size=24),
    st.integers(1, 16),
    st.integers(-2, 2),
    st.sampled_from(["", "a", "b"]),
    st.integers(0, 3),
)


@settings(max_examples=int(os.environ.get("TINYLLM_POLICY_EXAMPLES", "40")))  # (thorough: set it higher)
@given(
    policy=st.sampled_from(SCHEDULING_POLICIES),
    chunked=st.booleans(),
    n_slots=st.integers(1, 4),
    spare=st.integers(0, 5),
    jobs=st.lists(job, min_size=1, max_size=12),
)
def test_random_arrivals_under_every_policy_keep_the_invariants(policy, chunked, n_slots, spare, jobs):
    max_len = 44
    eng = ContinuousEngine(
        _small,
        n_slots,
        max_len,
        kv="paged",
        block_size=4,
        kv_blocks=11 + spare,
        chunked_prefill=chunked,
        max_batched_tokens=n_slots + 6 if chunked else None,
        scheduling_policy=policy,
    )
    added = {}
    for prompt, new, prio, tenant, steps_before in jobs:
        for _ in range(steps_before):
            eng.step()
            check_invariants(eng)
        added[eng.add_request(Request(prompt, new, priority=prio, tenant=tenant))] = (tuple(prompt), new)
    steps = 0
    while eng.has_work():
        eng.step()
        steps += 1
        assert steps < 2000, "starved"
        check_invariants(eng)
        snap = eng.snapshot()
        ran = dict(snap.batch)
        for v in snap.requests:
            if v.state in ("queued", "preempted", "running"):
                assert (v.wait == "") == (v.rid in ran), (v.rid, v.wait, ran)
                assert v.wait == "" or v.wait in WAIT_REASONS
    assert eng.slots.allocated_tokens() == 0
    for rid, (prompt, new) in added.items():
        assert eng.results[rid].tokens == _solo(prompt, new), f"request {rid} differs"


def test_the_fair_queue_forgets_idle_tenants_least_served_first():
    """One account per tenant was kept forever (a tenant is a client's `user` field): at 100k
    tenants each admission scanned them all. The accounts kept are the most served."""
    q = FairQueue()
    for i in range(3 * FairQueue.REMEMBERED):
        q.add(seq(i, tenant=f"user-{i}"))
        q.charge(q.pop(), 1 + i % 7)
    most = max(q.served.values())
    assert len(q.served) <= FairQueue.REMEMBERED and f"user-{3 * FairQueue.REMEMBERED - 1}" in q.served
    q.add(seq(10**6, tenant="a"))
    q.add(seq(10**6 + 1, tenant="b"))
    assert q.served["a"] == q.served["b"] == most  # newcomers levelled with the most served, as before
    assert [q.pop().req.tenant, q.pop().req.tenant] == ["a", "b"]
