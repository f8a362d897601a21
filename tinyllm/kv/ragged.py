"""One forward pass over a mixed batch: decode tokens and prefill chunks, flattened (ragged).

The token-budget scheduler hands over a list of (slot, start, n): sequence ``slot`` runs its
context positions ``start .. start+n-1`` this step (n = 1 for a decode, more for a prefill
chunk). Every linear layer then runs once on all T tokens as one (1, T) batch; only attention
is per sequence. ``RaggedAttention`` is the AttentionCache the model sees for that pass: it
writes each token's K/V into the paged pool at its own position, then attends

- the decode tokens together: one batched call, each row against its own blocks (masked to its
  length), as the paged decode step does;
- each prefill chunk alone: its queries against its blocks up to the chunk's end, causal from
  the chunk's start (the tokens before ``start`` were computed in earlier steps).

No padding anywhere, so no idle rows are computed, and a request's prompt can be spread over
several steps without changing what any token sees.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tinyllm.model.transformer import grouped_attention
from tinyllm.kv.paged import PagedKVCache, gather_blocks


class RaggedAttention:
    def __init__(self, pool: PagedKVCache, items: list[tuple[int, int, int]]):
        """``items``: (slot, start, n) in batch order, one-token items first (decodes, and any
        one-token chunk: it sees exactly what a decode would). The slots' block tables must
        already cover ``start + n`` tokens."""
        self.pool, self.items = pool, items
        dev, bs = pool.device, pool.block_size
        self.n_decode = next((i for i, (_, _, n) in enumerate(items) if n != 1), len(items))
        pos, write = [], []
        for slot, start, n in items:
            table = pool.tables[slot]
            for p in range(start, start + n):
                pos.append(p)
                write.append(table[p // bs] * bs + p % bs)
        self.total = len(pos)
        self._pos = torch.tensor(pos, dtype=torch.long, device=dev)
        self._write = torch.tensor(write, dtype=torch.long, device=dev)
        self._decode = self._decode_plan() if self.n_decode else None
        self._chunks = [self._chunk_plan(slot, start, n) for slot, start, n in items[self.n_decode:]]

    def _decode_plan(self) -> tuple[Tensor, int, Tensor]:
        """Block ids (nd * nb,), window nb * block_size, and mask (nd, 1, 1, W): each decode row
        sees its blocks up to its own position (rows with fewer blocks pad with the scratch block)."""
        dev, bs = self.pool.device, self.pool.block_size
        dec = self.items[:self.n_decode]
        nb = -(-max(start + 1 for _, start, _ in dec) // bs)
        scratch = self.pool.scratch
        table = [self.pool.tables[slot][:nb] + [scratch] * (nb - min(nb, len(self.pool.tables[slot])))
                 for slot, _, _ in dec]
        blocks = torch.tensor(table, dtype=torch.long, device=dev).reshape(-1)
        ends = torch.tensor([start for _, start, _ in dec], dtype=torch.long, device=dev)
        mask = (torch.arange(nb * bs, device=dev)[None, :] <= ends[:, None])[:, None, None, :]
        return blocks, nb * bs, mask

    def _chunk_plan(self, slot: int, start: int, n: int) -> tuple[Tensor, int, Tensor]:
        """Block ids of positions 0..start+n-1, their length L, and a causal mask (1, 1, n, L)
        offset by ``start``."""
        dev, bs = self.pool.device, self.pool.block_size
        L = start + n
        blocks = torch.tensor(self.pool.tables[slot][:-(-L // bs)], dtype=torch.long, device=dev)
        q_pos = torch.arange(start, L, device=dev)
        mask = (torch.arange(L, device=dev)[None, :] <= q_pos[:, None])[None, None]
        return blocks, L, mask

    # -- AttentionCache protocol ----------------------------------------------------------------
    def begin(self, batch: int, n_new: int) -> Tensor:
        if batch != 1 or n_new != self.total:
            raise ValueError(f"RaggedAttention runs one flattened batch of {self.total} tokens, "
                             f"got {batch} x {n_new}")
        return self._pos[None, :]

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        kl, vl = self.pool.k[layer], self.pool.v[layer]              # (rows, Hkv, D)
        kl.index_copy_(0, self._write, k[0].transpose(0, 1).to(kl.dtype))   # index_copy_: a plain row copy,
        vl.index_copy_(0, self._write, v[0].transpose(0, 1).to(vl.dtype))   # cheaper than index_put_
        outs = []
        nd = self.n_decode
        bs = self.pool.block_size
        if nd:
            blocks, W, mask = self._decode
            qd = q[0, :, :nd].transpose(0, 1).unsqueeze(2)           # (nd, H, 1, D)
            keys = gather_blocks(kl, blocks, bs).view(nd, W, *kl.shape[1:]).transpose(1, 2).to(q.dtype)
            vals = gather_blocks(vl, blocks, bs).view(nd, W, *vl.shape[1:]).transpose(1, 2).to(q.dtype)
            outs.append(grouped_attention(qd, keys, vals, mask).squeeze(2).transpose(0, 1)[None])
        off = nd
        for (_, start, n), (blocks, L, mask) in zip(self.items[nd:], self._chunks):
            qc = q[:, :, off:off + n]                                 # (1, H, n, D)
            keys = gather_blocks(kl, blocks, bs)[:L].transpose(0, 1)[None].to(q.dtype)   # (1, Hkv, L, D)
            vals = gather_blocks(vl, blocks, bs)[:L].transpose(0, 1)[None].to(q.dtype)
            outs.append(grouped_attention(qc, keys, vals, mask))
            off += n
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

    def end(self, n_new: int) -> None:
        for slot, start, n in self.items:
            self.pool.lens[slot] = start + n
        self.pool._dirty = True
