"""Paged KV cache: the K/V tensors of a block pool shared by all slots (the bookkeeping, with
the prefix cache, is ``blocks.BlockPool``). Same slot interface as ``SlotKVCache``.

The pool is token-major, one row per token of every block; a slot's positions map to rows through
its block table. Every forward over the pool (decodes and prefill chunks) is a ragged batch of its
running sequences (``ragged.RaggedAttention``): no idle slot computes a row, so a pool sized by
memory can hold many more slots than run. On CPU in float32 attention reads the blocks in place,
every token of the step in one C call (``tinyllm/native.py``); otherwise it gathers each
sequence's blocks with one indexing op per layer (no Python loop over tokens or blocks). An extra
scratch block pads the shorter sequences' windows and tables.

The slot cache (``kv="slots"``) is this pool with ``reserve_whole`` set: an admitted slot takes
the blocks of max_len at once (the slot cache's reservation rule: it never runs short), and it
runs on the same kernels as the paged pool.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tinyllm.kv.blocks import BlockPool, prefix_key

__all__ = ["BlockPool", "PagedKVCache", "gather_blocks", "prefix_key"]


def gather_blocks(pool: Tensor, blocks: Tensor, block_size: int, out: Tensor | None = None) -> Tensor:
    """The tokens of ``blocks`` (a flat tensor of block ids), in order: (len(blocks) * block_size,
    Hkv, D). One ``index_select`` over whole blocks: about 5x faster on CPU than indexing the
    same tokens one row each (measured: 70 vs 370 us for 16 rows x 12 blocks of 16). ``out``: a
    flat buffer at least that large to write into (a workspace reused by every layer: on CPU a
    fresh multi-MB tensor per layer costs more in page faults than the copy itself)."""
    width = block_size * pool.size(1) * pool.size(2)
    rows = pool.view(-1, width)
    if out is None:
        return torch.index_select(rows, 0, blocks).view(-1, pool.size(1), pool.size(2))
    dst = out[: blocks.numel() * width].view(-1, width)
    return torch.index_select(rows, 0, blocks, out=dst).view(-1, pool.size(1), pool.size(2))


class PagedKVCache(BlockPool):
    """A BlockPool with the K/V its blocks index, attended by the slots' decode step."""

    def __init__(
        self,
        n_layers: int,
        n_slots: int,
        n_kv_heads: int,
        head_dim: int,
        n_blocks: int,
        block_size: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ):
        super().__init__(n_slots, n_blocks, block_size, max_len)
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.scratch = n_blocks  # the extra block short windows pad with
        shape = (n_layers, (n_blocks + 1) * block_size, n_kv_heads, head_dim)  # token-major pool
        self.k = torch.zeros(shape, dtype=dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=dtype, device=self.device)
        self._workspace = (torch.empty(0, dtype=dtype, device=self.device),) * 2
        # the block tables as a (n_slots, table_width) tensor over BlockPool.table_array (the same
        # memory, kept current by the pool): what the C kernels read a step's tables from. Written
        # only through BlockPool (a step's rows were checked against it when they were built)
        self.table_rows = torch.frombuffer(self.table_array, dtype=torch.int64).view(n_slots, self.table_width)

    def workspace(self, tokens: int) -> tuple[Tensor, Tensor]:
        """Two flat buffers (K, V), each big enough for ``tokens`` tokens of one layer, that
        attention gathers blocks into: allocated once and grown, not once per layer and step."""
        need = tokens * self.n_kv_heads * self.head_dim
        if self._workspace[0].numel() < need:
            self._workspace = tuple(torch.empty(need, dtype=self.k.dtype, device=self.device) for _ in range(2))
        return self._workspace

    def fork(self, src: int, dst: int) -> tuple[int, int] | None:
        """BlockPool.fork, plus the copy of the partial block's K/V rows (every layer)."""
        pair = super().fork(src, dst)
        if pair is not None:
            bs = self.block_size
            a, b = pair[0] * bs, pair[1] * bs
            self.k[:, b : b + bs] = self.k[:, a : a + bs]
            self.v[:, b : b + bs] = self.v[:, a : a + bs]
        return pair
