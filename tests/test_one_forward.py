"""One forward for every scheduler: static batching, the slot cache, the paged pool and the
token-budget scheduler differ in their decisions, not in the kernels or storage that run them."""

from __future__ import annotations

import torch

from tests.helpers import random_model
from tinyllm.engine import ContinuousEngine, Request, StaticBatcher
from tinyllm.engine.forward import ragged_forward
from tinyllm.kv.paged import PagedKVCache

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], [9] * 20, [1]]


def run_batch(model, n_blocks: int, block_size: int, max_len: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """A prefill of PROMPTS, then one decode of every row, on a pool of the given shape: the
    logits of both passes."""
    cfg = model.cfg
    pool = PagedKVCache(cfg.n_layers, len(PROMPTS), cfg.n_kv_heads, cfg.head_dim, n_blocks, block_size, max_len)
    order = sorted(range(len(PROMPTS)), key=lambda i: len(PROMPTS[i]) != 1)  # one-token rows first
    rows, flat, at = [], [], []
    for s in order:
        pool.activate(s)
        pool.try_grow(s, 40)
        rows.append((s, 0, len(PROMPTS[s])))
        flat += PROMPTS[s]
        at.append(len(flat) - 1)
    with torch.no_grad():
        prefill = ragged_forward(model, pool, rows, flat, at)
        decode = ragged_forward(
            model, pool, [(s, len(p), 1) for s, p in enumerate(PROMPTS)], [1, 2, 3, 4], [0, 1, 2, 3]
        )
    return prefill, decode


def test_the_same_batch_gives_the_same_bits_on_every_lanes_storage():
    """A pool of one block of max_len per slot, the paged pool's small blocks
    and static batching's (its reserved rows in blocks of 16) give bit-identical logits for the
    same rows: a lane's figures differ only by what its scheduler put in each pass."""
    model = random_model()
    slots = run_batch(model, n_blocks=len(PROMPTS), block_size=64)
    paged = run_batch(model, n_blocks=30, block_size=8)
    static = run_batch(model, n_blocks=len(PROMPTS) * 4, block_size=16)
    for other in (paged, static):
        assert torch.equal(slots[0], other[0]) and torch.equal(slots[1], other[1])


def test_every_lane_says_the_same_kernels_and_only_static_wastes_rows():
    model = random_model()
    reqs = [Request(p, n) for p, n in zip(PROMPTS, (3, 9, 5, 2))]
    static = StaticBatcher(model, 4)
    engines = [
        ContinuousEngine(model, 4, max_len=64),
        ContinuousEngine(model, 4, max_len=64, kv="paged", block_size=8),
        ContinuousEngine(model, 4, max_len=64, kv="paged", chunked_prefill=True, max_batched_tokens=32),
    ]
    assert {static.kernels} == {e.kernels for e in engines}
    for r in reqs:
        static.add_request(r)
    while static.has_work():
        static.step()
    outs = {rid: res.tokens for rid, res in static.results.items()}
    for eng in engines:
        rids = [eng.add_request(r) for r in reqs]
        while eng.has_work():
            eng.step()
        assert {rid: eng.results[rid].tokens for rid in rids} == outs  # greedy: the same tokens
        assert eng.stats.useful_rows == eng.stats.computed_rows  # no idle slot computes a row
    # static batching decodes all four rows until the longest (9 tokens) is done: 8 decodes x 4 rows
    assert static.stats.computed_rows == 8 * 4
    assert static.stats.useful_rows == sum(n - 1 for n in (3, 9, 5, 2))


def test_a_slot_is_reserved_whole_at_admission_and_freed_on_abort():
    model = random_model()
    eng = ContinuousEngine(model, 2, max_len=32)
    assert eng.slots.reserve_whole and eng.slots.n_blocks == 2 * 32 // eng.slots.block_size
    rid = eng.add_request(Request([1, 2, 3], 5))
    eng.step()
    assert eng.slots.allocated_tokens() == 32  # the whole slot, from admission
    eng.abort(rid)
    assert eng.slots.allocated_tokens() == 0 and eng.slots.num_free_blocks() == eng.slots.n_blocks


def test_the_verdict_says_what_made_the_difference_from_the_lanes_own_work():
    """With one forward for every lane, a win over static batching is its wasted rows, its
    queueing and the winner's preemptions: the sentence quotes each lane's own figures."""
    from tests.helpers import race_run
    from tinyllm.race.race import build_race
    from tinyllm.race.verdicts import rank, what_made_the_difference

    model = random_model(max_seq_len=128)
    reqs = [Request([3 + i, 4, 5], n) for i, n in enumerate((2, 30, 3, 4, 28, 2))]  # (no eos_id: no early end)
    race = build_race(
        model, [(0.0, r) for r in reqs], race_run(3, 128), lanes=("static", "continuous"), step_cost_s=0.01
    )
    while race.step() is not None:
        pass
    views = race.views()
    ranking = rank(views)
    static, cont = (v.result for v in views)
    assert ranking.places == (2, 1)  # continuous finishes first: fewer steps on the same clock
    why = what_made_the_difference(views, ranking)
    wasted = static.computed_rows - static.useful_rows
    assert wasted > 0 and cont.computed_rows == cont.useful_rows
    assert f"static batching computed {wasted:,} of {static.computed_rows:,} rows" in why
    assert f"wasted 0 of {cont.computed_rows:,} rows (0%) over {cont.decode_steps:,}" in why
    assert what_made_the_difference(views[::-1][:1], rank(views[::-1][:1])) == ""  # nothing to compare


def test_static_batchings_pool_holds_its_batches_reservation_not_the_models_context():
    """A pool sized for every row at the model's whole context would be gigabytes for a long-context
    checkpoint: the pool holds what the largest batch so far reserves (its padded rows)."""
    model = random_model(max_seq_len=128)
    eng = StaticBatcher(model, 2)
    for p, n in (([1, 2, 3], 5), ([4, 5], 20)):
        eng.add_request(Request(p, n))
    eng.step()
    assert eng.pool.n_blocks == 2 * 2  # 2 rows of 3 + 20 tokens: two blocks of 16 each
    while eng.has_work():
        eng.step()
    assert eng.pool.allocated_tokens() == 0  # every block back once the batch ended
