"""Automatic prefix caching: shared full KV blocks with reference counts. Greedy output equals
solo in every sharing situation nano-vllm and vLLM learned the hard way, and what is reused is
visible (counters, cached tokens per request, per-block refs)."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import check_invariants, chunked_engine, random_model, solo_outputs
from tests.test_paged import op  # noqa: F401  (loads the shared hypothesis profile)
from tinyllm.engine import ContinuousEngine, Request
from tinyllm.engine.solo import generate
from tinyllm.kv.paged import prefix_key

BS = 4


@pytest.fixture(scope="module")
def model():
    return random_model(seed=2)


def engine(model, n_slots=4, kv_blocks=None, budget=64, prefix_cache=True):
    return chunked_engine(model, n_slots, block_size=BS, budget=budget, kv_blocks=kv_blocks, prefix_cache=prefix_cache)


def run(eng, reqs, steps_between: int = 0):
    """Add requests one at a time, ``steps_between`` steps apart; run to the end, checking the
    invariants (refcounts included) after every step. Returns each request's tokens."""
    rids = []
    for r in reqs:
        rids.append(eng.add_request(r))
        for _ in range(steps_between):
            eng.step()
            check_invariants(eng)
    while eng.has_work():
        eng.step()
        check_invariants(eng)
    assert eng.slots.allocated_tokens() == 0 and sum(eng.slots.ref) == 0
    return [eng.results[r].tokens for r in rids], rids


HEADER = list(range(10, 30))  # 20 tokens: 5 full blocks of 4


def test_identical_prompts_share_all_but_the_last_token(model):
    reqs = [Request(HEADER + [7], 8), Request(HEADER + [7], 8), Request(HEADER + [7], 5)]
    eng = engine(model)
    out, rids = run(eng, reqs, steps_between=2)
    assert out == solo_outputs(model, reqs)
    snap = eng.snapshot()
    assert snap.request(rids[0]).cached_tokens == 0
    assert [snap.request(r).cached_tokens for r in rids[1:]] == [20, 20]  # 21 tokens: the last is computed
    assert snap.counters.prefix_queries == 3 * 21 and snap.counters.prefix_hits == 40


def test_a_prompt_that_is_exactly_whole_blocks_still_computes_its_last_token(model):
    """The num_blocks - 1 rule: a hit never covers the whole prompt (a zero-token prefill crashed
    nano-vllm): 20 tokens = 5 full blocks, so at most 4 blocks come from the cache."""
    reqs = [Request(HEADER, 6), Request(HEADER, 6)]
    eng = engine(model)
    out, rids = run(eng, reqs, steps_between=3)
    assert out == solo_outputs(model, reqs)
    assert eng.snapshot().request(rids[1]).cached_tokens == 16


def test_one_prompt_a_prefix_of_another_and_prompts_differing_in_the_last_block(model):
    reqs = [
        Request(HEADER[:12], 6),
        Request(HEADER + [1, 2, 3], 6),
        Request(HEADER[:16] + [9, 9, 9, 9, 5], 6),
        Request(HEADER[:16] + [8, 8, 8, 8, 5], 6),
    ]
    eng = engine(model)
    out, rids = run(eng, reqs, steps_between=3)
    assert out == solo_outputs(model, reqs)
    cached = [eng.snapshot().request(r).cached_tokens for r in rids]
    assert cached == [0, 12, 16, 16]  # #1 reuses all 3 of #0's prompt blocks (full once computed)


def test_a_hit_while_the_owner_is_still_decoding_shares_its_blocks(model):
    reqs = [Request(HEADER + [3], 30), Request(HEADER + [4, 5], 10)]
    eng = engine(model)
    eng.add_request(reqs[0])
    for _ in range(3):
        eng.step()
    b = eng.add_request(reqs[1])
    eng.step()
    check_invariants(eng)
    snap = eng.snapshot()
    assert snap.request(0).state == "running" and snap.request(b).cached_tokens == 20
    assert sum(1 for r in snap.kv.block_refs if r == 2) == 5  # the header's blocks, held by both
    while eng.has_work():
        eng.step()
        check_invariants(eng)
    assert [eng.results[0].tokens, eng.results[b].tokens] == solo_outputs(model, reqs)


def test_a_freed_cached_block_is_revived_with_its_key(model):
    """After its owner finishes, the header's blocks are free but still cached; a later request
    revives them (nano-vllm once wiped the hash on revival and broke the chain: commit 9fa256a)."""
    eng = engine(model)
    first = Request(HEADER + [1], 4)
    run(eng, [first])
    snap = eng.snapshot()
    # 21 prompt + 3 generated tokens were computed: 6 full blocks, all cached, all free
    assert snap.kv.cached_free_blocks == 6 and snap.kv.free_blocks == snap.kv.n_blocks
    header_blocks = eng.slots.match_prefix(HEADER + [0])
    assert len(header_blocks) == 5
    reqs = [Request(HEADER + [2], 6), Request(HEADER + [2, 3, 4, 5, 6], 6)]
    eng.add_request(reqs[0])
    eng.step()
    assert eng.slots.tables[eng._running[0].slot][:5] == header_blocks  # revived, not recomputed
    assert all(eng.slots.block_key[b] is not None for b in header_blocks)  # and still cached
    out, rids = run(eng, reqs[1:], steps_between=4)
    assert [eng.results[0 + 1].tokens] + out == solo_outputs(model, reqs)
    assert eng.snapshot().request(1).cached_tokens == 20 and eng.snapshot().request(rids[0]).cached_tokens >= 20


def test_preempting_a_request_whose_blocks_others_share(model):
    reqs = [Request(HEADER + [1], 40), Request(HEADER + [2], 40), Request(HEADER + [3], 40)]
    eng = engine(model, n_slots=3, kv_blocks=20, budget=8)  # 20 blocks: three 60-token contexts can't fit
    out, _ = run(eng, reqs, steps_between=1)
    assert out == solo_outputs(model, reqs)
    assert eng.stats.preemptions > 0


def test_a_pool_so_tight_that_cached_blocks_are_evicted(model):
    """Distinct long prompts through a small pool: cached free blocks are evicted, oldest first,
    and a prompt seen again after its blocks were evicted is simply computed again."""
    prompts = [[p] * 1 + list(range(40 + 9 * p, 60 + 9 * p)) for p in range(5)]
    reqs = [Request(p, 6) for p in prompts] + [Request(prompts[0], 6)]
    eng = engine(model, n_slots=2, kv_blocks=14)
    out, rids = run(eng, reqs)
    assert out == solo_outputs(model, reqs)
    assert eng.snapshot().request(rids[-1]).cached_tokens == 0  # #0's blocks were evicted long ago
    assert len(eng.slots.cached) <= 14


def test_off_switch_and_clear(model):
    reqs = [Request(HEADER + [7], 5), Request(HEADER + [7], 5)]
    off = engine(model, prefix_cache=False)
    out, rids = run(off, reqs, steps_between=2)
    assert out == solo_outputs(model, reqs)
    assert off.snapshot().counters.prefix_hits == 0 and not off.slots.cached
    on = engine(model)
    run(on, reqs[:1])
    assert on.snapshot().kv.cached_free_blocks == 6  # 21 prompt + 5 new: 25 computed, 6 full blocks
    assert on.clear_prefix_cache() == 6
    assert on.snapshot().kv.cached_free_blocks == 0 and not on.slots.cached
    out, rids = run(on, reqs[1:])
    assert on.snapshot().request(rids[0]).cached_tokens == 0
    with pytest.raises(ValueError, match="prefix_cache needs chunked_prefill=True"):
        ContinuousEngine(model, 2, kv="paged", prefix_cache=True)


def test_a_hash_collision_never_serves_wrong_kv(model):
    """Force every block key to collide: a lookup must compare the stored token ids and miss."""
    eng = engine(model)
    run(eng, [Request(HEADER + [1], 4)])
    victim_key = next(iter(eng.slots.cached))
    block = eng.slots.cached.pop(victim_key)
    other = tuple(range(100, 104))  # what a different prompt's first block hashes to
    forged = prefix_key(None, other)
    eng.slots.cached[forged], eng.slots.block_key[block] = block, forged
    reqs = [Request(list(other) + HEADER[4:] + [1], 5)]
    out, rids = run(eng, reqs)
    assert out == solo_outputs(model, reqs)
    assert eng.snapshot().request(rids[0]).cached_tokens == 0


_tiny = random_model(seed=5, vocab=32, d_model=32, n_layers=1, max_seq_len=64)
PREFIXES = ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [5] * 12, [])


@functools.cache
def _solo(prompt: tuple, new: int) -> list[int]:
    return generate(_tiny, list(prompt), new)


share_op = st.one_of(
    st.tuples(
        st.just("add"), st.integers(0, len(PREFIXES) - 1), st.lists(st.integers(0, 31), max_size=6), st.integers(1, 12)
    ),
    st.tuples(st.just("abort"), st.integers(0, 30)),
    st.tuples(st.just("step"), st.integers(1, 4)),
    st.tuples(st.just("clear")),
)


@given(
    n_slots=st.integers(1, 4),
    block_size=st.sampled_from([1, 2, 4]),
    spare_blocks=st.integers(0, 8),
    ops=st.lists(share_op, max_size=30),
)
def test_random_schedules_over_shared_prefixes_keep_refcounts_exact(n_slots, block_size, spare_blocks, ops):
    """Prompts built from a few shared prefixes, random add / abort / step / clear, a tight pool:
    refcounts equal table entries, referenced blocks never free, cached keys consistent and
    each cached block full (check_invariants), nothing referenced at the end, and every finished
    request equals solo."""
    max_len = 40
    eng = chunked_engine(
        _tiny,
        n_slots,
        max_len,
        block_size=block_size,
        budget=n_slots + 5,
        kv_blocks=-(-max_len // block_size) + spare_blocks,
    )
    added, aborted = {}, set()
    for o in ops:
        if o[0] == "add":
            prompt = PREFIXES[o[1]] + o[2] or [3]
            added[eng.add_request(Request(prompt, min(o[3], max_len - len(prompt))))] = prompt
        elif o[0] == "abort":
            if eng.abort(o[1]):
                aborted.add(o[1])
        elif o[0] == "clear":
            eng.clear_prefix_cache()
            check_invariants(eng)
        else:
            for _ in range(o[1]):
                eng.step()
                check_invariants(eng)
                for b in eng.slots.cached.values():
                    assert len(eng.slots.block_tokens[b]) == block_size
    while eng.has_work():
        eng.step()
        check_invariants(eng)
    assert sum(eng.slots.ref) == 0 and eng.slots.allocated_tokens() == 0
    finished = {rid: r for rid, r in eng.results.items() if r.state == "finished"}
    assert set(eng.results) == set(added) and set(finished) == set(added) - aborted
    for rid, res in finished.items():
        assert res.tokens == _solo(tuple(added[rid]), len(res.tokens)) or res.tokens == _solo(
            tuple(added[rid]), eng._seqs[rid].req.max_new_tokens
        ), f"request {rid} differs from solo"


def test_cached_tokens_is_the_prompts_first_hit_however_often_a_request_is_recomputed(model):
    """OpenAI's usage.prompt_tokens_details.cached_tokens counts prompt tokens: a request preempted
    and recomputed from the cache once reported its whole context (224 cached for a 5-token
    prompt). The view keeps the first admission's prompt hit; each admission's event still says
    what the cache served of the context then (a recompute's hit is the scheduler's news)."""
    eng = engine(model, n_slots=4, kv_blocks=14, budget=64)
    reqs = [Request([7, 8, 9, 10, 11], 40) for _ in range(5)]  # one prompt: later ones hit the cache
    events = []
    rids = [eng.add_request(r) for r in reqs]
    while eng.has_work():
        eng.step()
        events += eng.pop_lifecycle()
        check_invariants(eng)
    views = {v.rid: v for v in eng.snapshot().requests}
    assert any(v.preemptions for v in views.values()), "the pool should force a preemption"
    recomputes = [e for e in events if e.kind == "admitted" and "recompute" in e.reason]
    assert recomputes and max(e.cached for e in recomputes) > 5  # the recompute hit its context
    for rid in rids:
        first = next(e for e in events if e.kind == "admitted" and e.rid == rid)
        assert views[rid].cached_tokens == first.cached <= len(reqs[0].prompt)
