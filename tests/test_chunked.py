"""The token-budget scheduler (chunked prefill, one mixed forward per step): greedy == solo
under every budget, block size and pool, with preemption mid-prefill and mid-decode and aborts
at every stage; the scheduler's own invariants under random schedules (hypothesis)."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import check_invariants, chunked_engine, engine_workload, random_model, run_random_ops, solo_outputs
from tests.test_paged import op  # noqa: F401  (also loads the shared hypothesis profile)
from tinyllm.engine import ContinuousEngine, Request, run_continuous, run_static
from tinyllm.engine.solo import generate


@pytest.fixture(scope="module")
def workload(model):
    return engine_workload(20, seed=4)  # (on random_model(), the model fixture's weights)


def chunked(model, n_slots, budget, block_size=8, kv_blocks=None, max_len=None):
    return chunked_engine(model, n_slots, max_len, block_size=block_size, budget=budget, kv_blocks=kv_blocks)


def check_chunked(eng: ContinuousEngine) -> None:
    """The cache invariants plus the scheduler's: computed never exceeds the context, and the
    pool's length of each slot is exactly what its sequence has computed."""
    check_invariants(eng)
    for seq in eng._running:
        assert 0 < seq.computed <= len(seq.req.prompt) + len(seq.out)
        assert eng.slots.lens[seq.slot] == seq.computed and eng._slot_seq[seq.slot] is seq
    assert len(eng._running) == sum(eng.slots.active)


def run_steps(eng: ContinuousEngine, reqs: list[Request]) -> tuple[list[list[int]], list]:
    """Run to completion, checking after each step that the batch kept to the budget and that
    every request that was decoding got its token (or finished, or was preempted)."""
    rids = [eng.add_request(r) for r in reqs]
    events = []
    while eng.has_work():
        decoding = {s.rid: len(s.out) for s in eng._running if s.remaining() == 1 and s.prefilled}
        before = eng.stats.prefill_tokens
        eng.step()
        check_chunked(eng)
        lifecycle = eng.pop_lifecycle()
        events += lifecycle
        preempted = {e.rid for e in lifecycle if e.kind == "preempted"}
        for rid, n in decoding.items():
            seq = eng._seqs[rid]
            assert len(seq.out) == n + 1 or rid in preempted, f"decode of #{rid} starved"
        chunk_tokens = eng.stats.prefill_tokens - before
        decodes = sum(1 for rid in decoding if rid not in preempted)
        assert chunk_tokens + decodes <= eng.max_batched_tokens
    assert eng.slots.allocated_tokens() == 0
    return [eng.results.pop(r).tokens for r in rids], events


@pytest.mark.parametrize(
    "n_slots, budget, block_size", [(1, 1, 4), (4, 7, 4), (4, 7, 16), (6, 64, 1), (6, 64, 8), (8, 512, 16)]
)
def test_every_budget_and_block_size_equals_solo(model, workload, n_slots, budget, block_size):
    reqs, solo = workload
    out, events = run_steps(chunked(model, n_slots, budget, block_size), reqs)
    assert out == solo
    chunks = [e for e in events if e.kind == "prefill"]
    if budget < 60:  # the longest prompts needed several chunks
        assert any(not e.reason.endswith(f"of {e.reason.split('..')[1].split()[0]}") for e in chunks)


def _preempted_mid_prefill(events) -> bool:
    """A 'preempted' event that came after a chunk which did not finish its context."""
    last_chunk: dict[int, str] = {}
    for e in events:
        if e.kind == "prefill":
            last_chunk[e.rid] = e.reason
        elif e.kind in ("first_token", "finished"):
            last_chunk.pop(e.rid, None)
        elif e.kind == "preempted" and e.rid in last_chunk:
            span, _, total = last_chunk[e.rid].partition(" of ")
            if int(span.split("..")[1]) < int(total):
                return True
    return False


@pytest.mark.parametrize("budget, block_size, kv_blocks", [(8, 4, 30), (16, 4, 24), (64, 8, 12), (7, 2, 60)])
def test_tight_pools_preempt_mid_prefill_and_mid_decode_and_still_equal_solo(
    model, workload, budget, block_size, kv_blocks
):
    reqs, solo = workload
    eng = chunked(model, 6, budget, block_size, kv_blocks)
    out, events = run_steps(eng, reqs)
    assert out == solo
    assert eng.stats.preemptions > 0
    kinds = {e.kind for e in events}
    assert {"queued", "admitted", "prefill", "first_token", "preempted", "finished"} <= kinds


def test_some_tight_pool_preempts_a_request_mid_prefill(model, workload):
    reqs, solo = workload
    long_prompts = [Request(list(range(1, 50)), 30), Request(list(range(3, 60)), 25), Request([7] * 40, 30)]
    out, events = run_steps(chunked(model, 3, 8, 4, 30), long_prompts + reqs[:4])
    assert out == solo_outputs(model, long_prompts) + solo[:4]
    assert _preempted_mid_prefill(events)


@pytest.mark.parametrize("stage", ["queued", "mid_prefill", "decoding"])
def test_abort_at_every_stage_frees_everything_and_spares_the_others(model, stage):
    others = [Request([5, 6, 7], 12), Request([9, 10, 11, 12], 10)]
    victim = Request(list(range(1, 57)), 20)  # 56 prompt tokens: many chunks at budget 8
    eng = chunked(model, 3 if stage != "queued" else 2, 8, 4)
    rids = [eng.add_request(r) for r in others]
    vid = eng.add_request(victim)
    for _ in range(60):
        v = eng._seqs[vid]
        if (
            stage == "queued"
            and v.state == "queued"
            or stage == "mid_prefill"
            and v.state == "running"
            and 0 < v.computed < 56
            or stage == "decoding"
            and len(v.out) >= 2
        ):
            break
        eng.step()
        check_chunked(eng)
    else:
        pytest.fail(f"never reached stage {stage}")
    assert eng.abort(vid)
    check_chunked(eng)
    while eng.has_work():
        eng.step()
        check_chunked(eng)
    assert [eng.results[r].tokens for r in rids] == solo_outputs(model, others)
    assert eng.results[vid].state != "finished" and eng.slots.allocated_tokens() == 0


def test_prefill_tokens_computed(model, workload):
    reqs, _ = workload
    _, s = run_continuous(model, reqs, 4, kv="paged", chunked_prefill=True, max_batched_tokens=16)
    assert s["preemptions"] == 0 and s["prefill_tokens_computed"] == sum(len(r.prompt) for r in reqs)
    _, s = run_continuous(
        model, reqs, 4, kv="paged", kv_blocks=14, block_size=8, chunked_prefill=True, max_batched_tokens=16
    )
    assert s["preemptions"] > 0 and s["prefill_tokens_computed"] > sum(len(r.prompt) for r in reqs)
    _, s = run_continuous(model, reqs, 4)
    assert s["prefill_tokens_computed"] == sum(len(r.prompt) for r in reqs)
    plain = [Request(r.prompt, r.max_new_tokens) for r in reqs[:8]]
    _, s = run_static(model, plain, 4)  # ragged like every lane: no padding computed
    assert s["prefill_tokens_computed"] == sum(len(r.prompt) for r in plain)


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        (dict(kv="slots", chunked_prefill=True), "chunked_prefill needs kv='paged'"),
        (
            dict(kv="paged", chunked_prefill=True, max_batched_tokens=3),
            "the token budget per step (max_batched_tokens, 3) is less than the 4 sequences that may run",
        ),
        (
            dict(kv="paged", chunked_prefill=True, max_batched_tokens=8.5),
            "max_batched_tokens (the token budget per step) must be an integer >= 1, got 8.5",
        ),
        (dict(kv="paged", chunked_prefill="yes"), "chunked_prefill must be True or False"),
    ],
)
def test_bad_scheduler_options_say_what_is_allowed(model, kwargs, msg):
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        ContinuousEngine(model, 4, **kwargs)


_small = random_model(seed=1, vocab=48, d_model=32, n_layers=1, max_seq_len=64)


@functools.cache
def _solo_cached(prompt: tuple, new: int, eos) -> list[int]:
    return generate(_small, list(prompt), new, eos_id=eos)


@given(
    n_slots=st.integers(1, 5),
    block_size=st.integers(1, 16),
    spare_blocks=st.integers(0, 6),
    extra_budget=st.sampled_from([0, 1, 6, 30, 200]),
    ops=st.lists(op, max_size=25),
)
def test_random_schedules_keep_the_schedulers_invariants(n_slots, block_size, spare_blocks, extra_budget, ops):
    max_len = 56
    eng = chunked(
        _small, n_slots, n_slots + extra_budget, block_size, -(-max_len // block_size) + spare_blocks, max_len=max_len
    )

    def checked_step(eng):
        tokens_before = {s.rid: s.computed for s in eng._running}
        eng.step()
        check_chunked(eng)
        assert (
            sum(max(0, s.computed - tokens_before.get(s.rid, s.cached_tokens)) for s in eng._running)
            <= eng.max_batched_tokens
        )

    added, _ = run_random_ops(eng, ops, max_len, checked_step)
    assert eng.slots.allocated_tokens() == 0 and not eng._running
    for rid, r in added.items():
        if eng.results[rid].state == "finished":  # (every request ends with a Result)
            assert eng.results[rid].tokens == _solo_cached(tuple(r.prompt), r.max_new_tokens, r.eos_id), (
                f"request {rid} differs"
            )
