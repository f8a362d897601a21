"""The ragged batch's PyTorch decode attention (kv/ragged.py; what runs where the C kernel cannot:
no compiler, CUDA, not float32): rows grouped by length, each group's blocks gathered into a
reused workspace, two batched matmuls per KV head. Checked against plain
attention over each sequence's own K/V, with the groups forced small (so the test models, whose
contexts fit one group of the default size, run many), and end to end: greedy == solo."""

from __future__ import annotations

import random

import pytest
import torch

from tests.helpers import check_ragged_columns, mixed_workload, solo_outputs, with_early_eos
from tinyllm import native
from tinyllm.engine import run_continuous
from tinyllm.kv import ragged
from tinyllm.kv.paged import PagedKVCache
from tinyllm.kv.ragged import RaggedAttention
from tinyllm.model.transformer import grouped_attention


@pytest.fixture(autouse=True)
def _pytorch_attention(monkeypatch):
    """These tests are about the PyTorch path: the C kernel (tests/test_native.py) off."""
    monkeypatch.setattr(native, "ENABLED", False)


def filled_pool(
    lens: list[int], block_size: int, hkv: int = 2, d: int = 8, seed: int = 0, layers: int = 1
) -> PagedKVCache:
    """A pool (one layer unless told) whose slots hold ``lens`` tokens of random K/V, their blocks handed out
    in turns (so a sequence's blocks are not adjacent, as in a running engine)."""
    torch.manual_seed(seed)
    n_blocks = sum(-(-n // block_size) + 1 for n in lens) + 4
    pool = PagedKVCache(layers, len(lens), hkv, d, n_blocks, block_size, max_len=max(lens) + block_size)
    need = [pool.blocks_for(n + 1) for n in lens]
    order = list(range(len(lens)))
    random.Random(seed).shuffle(order)
    for slot in range(len(lens)):
        pool.activate(slot)
    for b in range(max(need)):
        for slot in order:
            if need[slot] > b:
                assert pool.try_grow(slot, (b + 1) * block_size)
    pool.lens[:] = lens
    pool.k.normal_()
    pool.v.normal_()
    return pool


def reference(pool: PagedKVCache, slot: int, q: torch.Tensor, upto: int) -> torch.Tensor:
    """Attention of q (H, D) over positions 0..upto of the slot, each read through its block table."""
    bs = pool.block_size
    rows = [pool.tables[slot][p // bs] * bs + p % bs for p in range(upto + 1)]
    k = pool.k[0, rows].transpose(0, 1)[None]  # (1, Hkv, L, D)
    v = pool.v[0, rows].transpose(0, 1)[None]
    mask = torch.ones(1, 1, 1, upto + 1, dtype=torch.bool)
    return grouped_attention(q[None, :, None], k, v, mask)[0, :, 0]


@pytest.mark.parametrize("group_tokens", [1, 24, 64, 4096])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_decode_rows_attend_exactly_their_own_positions_in_any_grouping(monkeypatch, group_tokens, block_size):
    monkeypatch.setattr(ragged, "GROUP_TOKENS", group_tokens)
    lens = [1, 37, 5, 64, 16, 17, 2, 50, 33, 8]
    pool = filled_pool(lens, block_size)
    H, D = 4, pool.head_dim
    items = [(slot, n - 1, 1) for slot, n in enumerate(lens)]  # each decodes its last position
    attn = RaggedAttention(pool, items)
    q = torch.randn(1, H, len(items), D)
    k_new = pool.k[0, attn._write].transpose(0, 1)[None]  # rewrite what is there: unchanged
    v_new = pool.v[0, attn._write].transpose(0, 1)[None]
    out = attn.attend(0, q, k_new, v_new)
    assert attn._native is None and attn._decode  # the PyTorch path ran
    if group_tokens == 1:
        assert len(attn._decode) == len(lens)  # every row a group of its own
    assert out.shape == (1, H, len(items), D)
    for i, (slot, start, _) in enumerate(items):
        torch.testing.assert_close(out[0, :, i], reference(pool, slot, q[0, :, i], start), rtol=1e-5, atol=1e-5)


def test_decodes_and_a_prefill_chunk_share_one_batch_and_the_workspace(monkeypatch):
    """A chunk gathers into the same workspace after the decode groups used it: each still sees
    only its own blocks."""
    monkeypatch.setattr(ragged, "GROUP_TOKENS", 32)
    lens = [30, 9, 41, 20]
    pool = filled_pool(lens, 4, seed=3)
    H, D = 4, pool.head_dim
    items = [(0, 29, 1), (1, 8, 1), (2, 41 - 12, 12), (3, 20 - 5, 5)]  # two decodes, two chunks
    attn = RaggedAttention(pool, items)
    T = sum(n for _, _, n in items)
    q = torch.randn(1, H, T, D)
    out = attn.attend(0, q, pool.k[0, attn._write].transpose(0, 1)[None], pool.v[0, attn._write].transpose(0, 1)[None])
    check_ragged_columns(out, q, pool, items, reference)


@pytest.mark.parametrize("group_tokens", [8, 40])
def test_greedy_equals_solo_when_the_decode_rows_run_in_many_groups(model, monkeypatch, group_tokens):
    monkeypatch.setattr(ragged, "GROUP_TOKENS", group_tokens)
    reqs = with_early_eos(model, mixed_workload(16, seed=11))
    res, stats = run_continuous(model, reqs, 8, kv="paged", block_size=4, chunked_prefill=True, max_batched_tokens=64)
    assert [r.tokens for r in res] == solo_outputs(model, reqs)
    assert stats["kv_allocated_at_end"] == 0
