"""Paged KV cache: the K/V tensors of a block pool shared by all slots (the bookkeeping, with
the prefix cache, is ``blocks.BlockPool``). Same slot interface as ``SlotKVCache``.

The pool is token-major, one row per token of every block; a slot's positions map to rows through
its block table. Attention gathers each slot's blocks with one indexing op per layer (no Python
loop over tokens or blocks); an extra scratch block absorbs the writes of idle slots.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tinyllm.kv.blocks import BlockPool, prefix_key
from tinyllm.kv.dense import KVCache
from tinyllm.model.transformer import grouped_attention

__all__ = ["BlockPool", "PagedKVCache", "gather_blocks", "prefix_key"]

def gather_blocks(pool: Tensor, blocks: Tensor, block_size: int) -> Tensor:
    """The tokens of ``blocks`` (a flat tensor of block ids), in order: (len(blocks) * block_size,
    Hkv, D). One ``index_select`` over whole blocks: about 5x faster on CPU than indexing the
    same tokens one row each (measured: 70 vs 370 us for 16 rows x 12 blocks of 16)."""
    rows = pool.view(-1, block_size * pool.size(1) * pool.size(2))
    return torch.index_select(rows, 0, blocks).view(-1, pool.size(1), pool.size(2))


class PagedKVCache(BlockPool):
    """A BlockPool with the K/V its blocks index, attended by the slots' decode step."""

    def __init__(self, n_layers: int, n_slots: int, n_kv_heads: int, head_dim: int, n_blocks: int,
                 block_size: int, max_len: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None):
        super().__init__(n_slots, n_blocks, block_size, max_len)
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.scratch = n_blocks                              # the extra block idle rows write to
        shape = (n_layers, (n_blocks + 1) * block_size, n_kv_heads, head_dim)   # token-major pool
        self.k = torch.zeros(shape, dtype=dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=dtype, device=self.device)
        self._table_t = self._lens_t = self._mask = self._write = None
        self._n_win_blocks = 0

    def admit(self, slots: list[int], pre: KVCache, pad: list[int]) -> None:
        """Move each prefilled row's real tokens into blocks of its slot (positions from 0)."""
        for row, (s, p) in enumerate(zip(slots, pad)):
            n = pre.pos - p
            self.occupy(s, n)
            idx = self._token_index(s, n)
            for layer in range(self.n_layers):
                k, v = pre.real_kv(layer, row, p)                       # (Hkv, n, D)
                self.k[layer, idx] = k.transpose(0, 1).to(self.k.dtype)
                self.v[layer, idx] = v.transpose(0, 1).to(self.v.dtype)

    def fork(self, src: int, dst: int) -> tuple[int, int] | None:
        """BlockPool.fork, plus the copy of the partial block's K/V rows (every layer)."""
        pair = super().fork(src, dst)
        if pair is not None:
            bs = self.block_size
            a, b = pair[0] * bs, pair[1] * bs
            self.k[:, b:b + bs] = self.k[:, a:a + bs]
            self.v[:, b:b + bs] = self.v[:, a:a + bs]
        return pair

    # -- AttentionCache protocol (decode: one token per slot) -----------------------------
    def begin(self, batch: int, n_new: int) -> Tensor:
        if batch != self.n_slots or n_new != 1:
            raise ValueError(f"PagedKVCache decodes one token for each of its {self.n_slots} slots, "
                             f"got batch {batch} x {n_new} tokens")
        for s in range(self.n_slots):
            if self.active[s] and self.lens[s] >= len(self.tables[s]) * self.block_size:
                raise RuntimeError(f"slot {s} has no block for position {self.lens[s]}: call reserve_step() first")
        if self._dirty:
            self._sync()
        longest = max((n for n, a in zip(self.lens, self.active) if a), default=0)
        nb = self.blocks_for(longest + 1)
        self._n_win_blocks = nb
        k_pos = torch.arange(nb * self.block_size, device=self.device)
        self._mask = (k_pos[None, :] <= self._lens_t[:, None])[:, None, None, :]
        return self._lens_t[:, None]

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        kl, vl = self.k[layer], self.v[layer]
        kl[self._write] = k[:, :, 0].to(kl.dtype)                  # (S, Hkv, D) at each slot's position
        vl[self._write] = v[:, :, 0].to(vl.dtype)
        S, nb, bs = self.n_slots, self._n_win_blocks, self.block_size
        blocks = self._table_t[:, :nb].reshape(-1)
        keys = gather_blocks(kl, blocks, bs).view(S, nb * bs, *kl.shape[1:]).transpose(1, 2).to(q.dtype)
        vals = gather_blocks(vl, blocks, bs).view(S, nb * bs, *vl.shape[1:]).transpose(1, 2).to(q.dtype)
        return grouped_attention(q, keys, vals, self._mask)

    def end(self, n_new: int) -> None:
        for s in range(self.n_slots):
            if self.active[s]:
                self.lens[s] += 1
        self._dirty = True
        self._mask = None

    # -- internals ------------------------------------------------------------------------
    def _token_index(self, slot: int, n: int) -> Tensor:
        """Pool rows of a slot's positions 0..n-1."""
        pos = torch.arange(n, device=self.device)
        table = torch.tensor(self.tables[slot], dtype=torch.long, device=self.device)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def _sync(self) -> None:
        """Host tables/lengths → device tensors (once per step, only when something changed)."""
        rows = [t + [self.scratch] * (self.max_blocks - len(t)) for t in self.tables]
        self._table_t = torch.tensor(rows, dtype=torch.long, device=self.device)
        self._lens_t = torch.tensor(self.lens, dtype=torch.long, device=self.device)
        bs = self.block_size
        write = [self.tables[s][self.lens[s] // bs] * bs + self.lens[s] % bs if self.active[s] else self.scratch * bs
                 for s in range(self.n_slots)]
        self._write = torch.tensor(write, dtype=torch.long, device=self.device)
        self._dirty = False
