"""Paged KV: batched greedy equals solo with and without preemption; invariants under random
add / abort / step sequences (hypothesis) for both caches."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import check_invariants, engine_workload, random_model, run_checked, run_random_ops
from tinyllm.engine import ContinuousEngine, Request, Sampling, run_continuous
from tinyllm.engine.solo import generate

settings.register_profile(
    "ci", max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="module")
def model():
    return random_model()  # the engine-core tests' model and workload


@pytest.fixture(scope="module")
def workload(model):
    return engine_workload(28)  # (on random_model(), the model fixture's weights)


@pytest.mark.parametrize("n_slots, block_size, kv_blocks", [(4, 16, None), (7, 8, 200), (4, 1, 1000)])
def test_paged_without_preemption_equals_solo(model, workload, n_slots, block_size, kv_blocks):
    reqs, solo = workload
    results, summary = run_continuous(model, reqs, n_slots, kv="paged", block_size=block_size, kv_blocks=kv_blocks)
    assert [r.tokens for r in results] == solo
    assert summary["preemptions"] == 0 and summary["kv_allocated_at_end"] == 0


@pytest.mark.parametrize("n_slots, block_size, kv_blocks", [(7, 8, 14), (6, 16, 7), (5, 4, 30), (8, 1, 110)])
def test_paged_with_preemption_equals_solo(model, workload, n_slots, block_size, kv_blocks):
    reqs, solo = workload
    eng = ContinuousEngine(model, n_slots, kv="paged", block_size=block_size, kv_blocks=kv_blocks)
    assert run_checked(eng, reqs) == solo
    assert eng.stats.preemptions >= 3
    snap = eng.snapshot()
    assert sum(v.preemptions for v in snap.requests) == eng.stats.preemptions
    assert all(o is None for o in snap.kv.block_owner) and snap.kv.free_blocks == kv_blocks


def test_snapshot_shows_preempted_state_and_block_owners(model, workload):
    reqs, _ = workload
    eng = ContinuousEngine(model, 6, kv="paged", block_size=8, kv_blocks=14)
    for r in reqs:
        eng.add_request(r)
    saw_preempted = False
    while eng.has_work():
        eng.step()
        snap = eng.snapshot()
        saw_preempted |= any(v.state == "preempted" for v in snap.requests)
        for sv in snap.slots:
            for b in sv.blocks:
                assert snap.kv.block_owner[b] == sv.rid
        owned = sum(o is not None for o in snap.kv.block_owner)
        assert owned + snap.kv.free_blocks == snap.kv.n_blocks
        assert snap.kv.allocated_tokens == owned * snap.kv.block_size >= snap.kv.used_tokens
    assert saw_preempted


def test_request_too_big_for_the_pool_is_refused_with_numbers(model):
    eng = ContinuousEngine(model, 2, kv="paged", block_size=16, kv_blocks=3)
    with pytest.raises(
        ValueError, match=r"50 tokens need 4 blocks of 16, but the pool has only 3 blocks \(48 tokens\)"
    ):
        eng.add_request(Request([1] * 40, 10))
    eng.add_request(Request([1] * 38, 10))  # 48 tokens: exactly the pool


def test_default_pool_is_the_slot_cache_memory(model):
    eng = ContinuousEngine(model, 4, max_len=100, kv="paged", block_size=16)
    assert eng.slots.n_blocks == 4 * 7 and eng.slots.reserved_tokens() == 4 * 112


# -- property test ------------------------------------------------------------------------

_small = random_model(seed=2, vocab=48, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, max_seq_len=64)
_solo_cache: dict = {}


def _solo(req: Request) -> list[int]:
    key = (tuple(req.prompt), req.max_new_tokens, req.eos_id)
    if key not in _solo_cache:
        _solo_cache[key] = generate(_small, req.prompt, req.max_new_tokens, eos_id=req.eos_id)
    return _solo_cache[key]


# issue 24's request fields, extremes included, mixed into the random schedules
sampling_params = st.fixed_dictionaries(
    {
        "sampling": st.builds(
            Sampling,
            st.sampled_from([0, 1e-6, 0.7, 1.0, 1e30]),
            st.sampled_from([None, 1, 5]),
            st.sampled_from([None, 1e-46, 0.5, 1.0]),
            min_p=st.sampled_from([0, 0.1, 1]),
            presence_penalty=st.sampled_from([-2, 0, 2]),
            frequency_penalty=st.sampled_from([-2, 0, 2]),
            repetition_penalty=st.sampled_from([1e-300, 0.5, 1, 2, 1e300]),
            seed=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
        ),
        "stop_token_ids": st.lists(st.integers(0, 47), max_size=3),
        "min_tokens": st.integers(0, 6),
        "logprobs": st.one_of(st.none(), st.integers(0, 3)),
    }
)
op = st.one_of(
    st.tuples(
        st.just("add"),
        st.lists(st.integers(0, 47), min_size=1, max_size=30),
        st.integers(1, 24),
        st.one_of(st.none(), st.integers(0, 47)),
    ),
    st.tuples(
        st.just("add"),
        st.lists(st.integers(0, 47), min_size=1, max_size=30),
        st.integers(1, 24),
        st.one_of(st.none(), st.integers(0, 47)),
        sampling_params,
    ),
    st.tuples(st.just("abort"), st.integers(0, 40)),
    st.tuples(st.just("finish"), st.integers(0, 40), st.integers(0, 8)),
    st.tuples(st.just("step"), st.integers(1, 4)),
)


# An engine of either cache, its pool tight (one max-size request and a few blocks more).
ENGINES = dict(
    kv=st.sampled_from(["slots", "paged"]),
    n_slots=st.integers(1, 5),
    block_size=st.integers(1, 32),
    spare_blocks=st.integers(0, 6),
)


@given(**ENGINES, ops=st.lists(op, max_size=25))
def test_random_add_abort_step_keeps_invariants(kv, n_slots, block_size, spare_blocks, ops):
    max_len = 56
    kw = {}
    if kv == "paged":  # tight pool: one max-size request + a little
        kw = dict(block_size=block_size, kv_blocks=-(-max_len // block_size) + spare_blocks)
    eng = ContinuousEngine(_small, n_slots, max_len=max_len, kv=kv, **kw)

    def checked_step(eng):
        eng.step()
        check_invariants(eng)

    added, _ = run_random_ops(eng, ops, max_len, checked_step)
    assert eng.slots.allocated_tokens() == 0 and eng.slots.used_tokens() == 0
    for rid, req in added.items():
        if eng.results[rid].state == "finished":  # (every request ends with a Result)
            assert eng.results[rid].tokens == _solo(req), f"request {rid} differs from solo"


@pytest.mark.slow
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**ENGINES, ops=st.lists(op, max_size=40))
def test_random_add_abort_step_keeps_invariants_thorough(kv, n_slots, block_size, spare_blocks, ops):
    """The same property, ten times the examples and longer sequences (pytest -m slow)."""
    test_random_add_abort_step_keeps_invariants.hypothesis.inner_test(kv, n_slots, block_size, spare_blocks, ops)
