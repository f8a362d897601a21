"""The KV memory budget (issue 22): what a user sets is KV memory, and each path gets the
concurrency it buys. The slot cache reserves max_len per row (fewer rows); the paged pool spends
the same bytes on blocks and runs up to max_num_seqs sequences in them. Checked: the counts each
path gets, the old n_slots API, the refusals, and greedy == solo with 64+ sequences running at
once (fixed workloads and random schedules under the cache and scheduler invariants)."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import check_invariants, mixed_workload, random_model, run_random_ops, solo_outputs, with_early_eos
from tests.test_chunked import check_chunked
from tests.test_paged import op  # noqa: F401  (also loads the shared hypothesis profile)
from tinyllm.engine import ContinuousEngine, kv_bytes_per_token, run_continuous
from tinyllm.engine.build import MIB, rows_for_budget
from tinyllm.engine.solo import generate
from tinyllm.request import DEFAULT_MAX_NUM_SEQS


def budget_of(model, tokens: float) -> float:
    """MiB that hold ``tokens`` tokens of this model's K/V."""
    return tokens * kv_bytes_per_token(model, torch.device("cpu")) / MIB


def test_the_budget_gives_each_path_its_concurrency(model):
    max_len = 64
    budget = budget_of(model, 5.5 * max_len)  # five and a half rows of max_len
    slots = ContinuousEngine(model, max_len=max_len, kv_memory_mib=budget)
    assert slots.n_slots == 5 and slots.slots.reserved_tokens() == 5 * max_len
    paged = ContinuousEngine(model, max_len=max_len, kv="paged", block_size=8, kv_memory_mib=budget)
    assert paged.slots.n_blocks == 44 and paged.n_slots == DEFAULT_MAX_NUM_SEQS  # 352 tokens of blocks
    chunked = ContinuousEngine(
        model,
        max_len=max_len,
        kv="paged",
        block_size=8,
        kv_memory_mib=budget,
        chunked_prefill=True,
        max_num_seqs=100,
        max_batched_tokens=128,
    )
    assert chunked.slots.n_blocks == 44 and chunked.n_slots == 100
    small_budget = ContinuousEngine(
        model, max_len=max_len, kv="paged", kv_memory_mib=budget, chunked_prefill=True, max_batched_tokens=16
    )
    assert small_budget.n_slots == 16  # every running sequence decodes each step
    capped = ContinuousEngine(model, max_len=max_len, kv_memory_mib=budget_of(model, 200 * max_len), max_num_seqs=7)
    assert capped.n_slots == 7
    assert rows_for_budget(budget, max_len, kv_bytes_per_token(model, torch.device("cpu"))) == 5
    exact = ContinuousEngine(model, max_len=max_len, kv="paged", block_size=8, kv_memory_mib=budget_of(model, 352))
    assert exact.stats.summary([])["kv_reserved_mib"] == pytest.approx(budget_of(model, 352))


def test_n_slots_still_works_and_names_the_same_cap_as_max_num_seqs(model):
    assert ContinuousEngine(model, 4).n_slots == 4
    paged = ContinuousEngine(model, max_num_seqs=3, kv="paged", block_size=16)
    assert paged.n_slots == 3 and paged.slots.n_blocks == 3 * 128 // 16  # the slots' memory, as before
    assert ContinuousEngine(model, 3, max_num_seqs=3).n_slots == 3


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        (dict(n_slots=4, max_num_seqs=5), "name the same cap; give one"),
        (dict(kv="paged", kv_memory_mib=1.0, kv_blocks=8), "give kv_memory_mib or kv_blocks, not both"),
        (dict(), "give kv_memory_mib"),
        (dict(kv_memory_mib=0), "kv_memory_mib must be a number of MiB > 0"),
        (dict(kv_memory_mib="8"), "kv_memory_mib must be a number of MiB > 0"),
        (dict(kv_memory_mib=True), "kv_memory_mib must be a number of MiB > 0"),
        (dict(max_num_seqs=0), "max_num_seqs must be an integer >= 1"),
    ],
)
def test_bad_budget_settings_say_what_is_wrong(model, kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        ContinuousEngine(model, **kwargs)


@pytest.mark.parametrize("kv", ["slots", "paged"])
def test_a_budget_too_small_for_one_request_is_refused_with_the_numbers(model, kv):
    max_len = 64
    short = budget_of(model, max_len - 1)  # one token short of one request
    with pytest.raises(ValueError, match=r"too small for one request.*max_len 64.*raise the budget or lower max_len"):
        ContinuousEngine(model, max_len=max_len, kv=kv, kv_memory_mib=short)
    one = ContinuousEngine(model, max_len=max_len, kv=kv, kv_memory_mib=budget_of(model, max_len))
    assert one.slots.reserved_tokens() == max_len  # exactly one request's worth is enough
    assert ContinuousEngine(model, max_len=32, kv=kv, kv_memory_mib=short).slots.reserved_tokens() >= 32


@pytest.fixture(scope="module")
def wide_workload(model):
    reqs = with_early_eos(model, mixed_workload(96, seed=9))
    return reqs, solo_outputs(model, reqs)


@pytest.mark.parametrize("kind", ["paged", "chunked", "slots"])
def test_greedy_equals_solo_with_64_plus_sequences_on_what_the_budget_buys(model, wide_workload, kind):
    """96 requests, all queued at once. The paged paths get a pool a little smaller than they
    would fill (so some are preempted) and run up to 96 sequences; the slot cache gets 64 rows."""
    reqs, solo = wide_workload
    chunked = dict(chunked_prefill=True, max_batched_tokens=512) if kind == "chunked" else {}
    tokens = 64 * 128 if kind == "slots" else 6000
    layout = dict(kv="slots") if kind == "slots" else dict(kv="paged", block_size=8)  # (blocks: paged only)
    res, stats = run_continuous(
        model, reqs, **layout, kv_memory_mib=budget_of(model, tokens), max_num_seqs=96, **chunked
    )
    assert [r.tokens for r in res] == solo
    assert stats["peak_active"] >= 64 and stats["kv_allocated_at_end"] == 0


_small = random_model(seed=2, vocab=48, d_model=32, n_layers=1, max_seq_len=64)


@functools.cache
def _solo_cached(prompt: tuple, new: int, eos) -> list[int]:
    return generate(_small, list(prompt), new, eos_id=eos)


add = st.tuples(
    st.just("add"), st.lists(st.integers(0, 47), min_size=1, max_size=20), st.integers(2, 16), st.none()
)  # each runs for 2+ tokens: it is seen running


@settings(max_examples=12, deadline=None)
@given(
    chunked=st.booleans(),
    block_size=st.sampled_from([1, 4, 8, 16]),
    pool_tokens=st.integers(40, 6000),
    max_num_seqs=st.integers(64, 96),
    adds=st.lists(add, min_size=64, max_size=90),
    ops=st.lists(op, max_size=20),
    spec=st.sampled_from([0, 2, 4]),
    draft_model=st.booleans(),
)
def test_random_schedules_at_64_plus_sequences_keep_the_invariants_and_equal_solo(
    chunked, block_size, pool_tokens, max_num_seqs, adds, ops, spec, draft_model
):
    """64..90 requests queued at once, then random adds, aborts, finishes and steps, on a pool the
    budget buys (from one request's worth to all of them); every step keeps the cache's and the
    scheduler's invariants, and every plain greedy request that ran to its end equals solo. With
    the token budget, n-gram speculation drafts ``spec`` tokens (0: off): drafts accepted and
    rejected mid-schedule change no token and leak no block (the tiny model repeats itself); or
    ``draft_model``: the model itself drafts from a 4-token window, which it often gets wrong."""
    max_len = 40
    extra = (
        dict(
            chunked_prefill=True,
            max_batched_tokens=max_num_seqs + 20 * 90,
            num_speculative_tokens=spec,
            speculative_disable_by_batch_size=None,  # (drafts at any batch size: in the schedules)
        )
        if chunked
        else {}
    )
    eng = ContinuousEngine(
        _small,
        max_len=max_len,
        kv="paged",
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        kv_memory_mib=budget_of(_small, max(pool_tokens, -(-max_len // block_size) * block_size)),
        **extra,
    )
    if chunked and spec and draft_model:
        from tinyllm.engine.draft_model import DraftModelProposer

        eng.scheduler.proposer = DraftModelProposer(_small, window=4)

    def checked_step(eng):
        eng.step()
        (check_chunked if chunked else check_invariants)(eng)

    added, _ = run_random_ops(eng, [*adds, *ops], max_len, checked_step)
    assert eng.slots.allocated_tokens() == 0 and not eng._running
    untouched = not any(o[0] in ("abort", "finish") for o in ops)
    if untouched and pool_tokens >= len(adds) * 48:  # room for every queued request at once
        assert eng.stats.peak_active >= 64
    for rid, r in added.items():
        if eng.results[rid].state == "finished":  # (every request ends with a Result)
            assert eng.results[rid].tokens == _solo_cached(tuple(r.prompt), r.max_new_tokens, r.eos_id), rid


@pytest.mark.parametrize("kv", ["slots", "paged"])
def test_a_cache_larger_than_free_memory_is_refused_before_it_is_allocated(model, kv):
    """A budget (or a pool of blocks) no machine has free: a ValueError that says so, not an
    allocator's traceback from deep inside PyTorch (or a machine pushed into swap)."""
    with pytest.raises(
        ValueError,
        match=r"kv_memory_mib: a KV cache of 1,000,000,000 MiB is more than the [\d,]+ MiB "
        r"of memory free on cpu",
    ):
        ContinuousEngine(model, max_len=64, kv=kv, kv_memory_mib=1e9)
    if kv == "paged":
        with pytest.raises(ValueError, match="kv_memory_mib / kv_blocks: a KV cache of .* MiB is more than"):
            ContinuousEngine(model, 2, max_len=64, kv="paged", kv_blocks=10**12)
