"""One forward pass over a mixed batch: decode tokens and prefill chunks, flattened (ragged).

The token-budget scheduler hands over a list of (slot, start, n): sequence ``slot`` runs its
context positions ``start .. start+n-1`` this step (n = 1 for a decode, more for a prefill
chunk). Every linear layer then runs once on all T tokens as one (1, T) batch; only attention
is per sequence. ``RaggedAttention`` is the AttentionCache the model sees for that pass: it
writes each token's K/V into the paged pool at its own position, then attends.

On CPU in float32 (with a C compiler) every token of the step is one row of one C call per layer
(``native.decode_attention``): each token reads its own sequence's blocks in place, up to its own
position, so a chunk's tokens are causal from the chunk's start (the tokens before ``start`` were
computed in earlier steps) and a token computes the same values whichever chunk or step it
falls in. Elsewhere (CUDA, no compiler, autograd), PyTorch:

- the decode tokens together, in groups of similar length: each row against its own gathered
  blocks (masked to its length);
- each prefill chunk alone: its queries against its gathered blocks up to the chunk's end,
  causal from the chunk's start (SDPA with a mask).

No padding anywhere, so no idle rows are computed, and a request's prompt can be spread over
several steps without changing what any token sees.
"""

from __future__ import annotations

from array import array

import torch
from torch import Tensor

from tinyllm import native
from tinyllm.kv.paged import PagedKVCache, gather_blocks
from tinyllm.model.transformer import grouped_attention


def index_tensor(values: list[int], device: torch.device | str = "cpu") -> Tensor:
    """A list of ints as an int64 tensor: through an ``array`` (one C copy), ~4x faster than
    ``torch.tensor`` on a list, which a step pays several times per forward."""
    if not values:
        return torch.empty(0, dtype=torch.long, device=device)
    t = torch.frombuffer(array("q", values), dtype=torch.long)
    return t if torch.device(device).type == "cpu" else t.to(device)


GROUP_TOKENS = 4096  # window tokens per decode group (measured best of 1024..8192 on the d256 and
# bundled models at 16 and 64 rows: docs/benchmarks.md)


class RaggedAttention:
    def __init__(self, pool: PagedKVCache, items: list[tuple[int, int, int]]):
        """``items``: (slot, start, n) in batch order, one-token items first (decodes, and any
        one-token chunk: it sees exactly what a decode would). The slots' block tables must
        already cover ``start + n`` tokens."""
        self.pool, self.items = pool, items
        self.n_decode = next((i for i, (_, _, n) in enumerate(items) if n != 1), len(items))
        self.total = sum(n for _, _, n in items)
        rows = self._native_plan()
        if rows is not None:  # the C kernels': the rows built (and checked) in C
            self._pos, self._write, lens, row_table = rows
            self._native: tuple[Tensor, Tensor, Tensor] | None = (pool.table_rows, lens, row_table)
        else:
            dev, bs, tables = pool.device, pool.block_size, pool.tables
            pos, write = [], []
            for slot, start, n in items:
                table = tables[slot]
                if n == 1:  # a decode (most items): no inner loop
                    pos.append(start)
                    write.append(table[start // bs] * bs + start % bs)
                else:
                    pos += range(start, start + n)
                    write += [table[p // bs] * bs + p % bs for p in range(start, start + n)]
            self._pos = index_tensor(pos, dev)
            self._write = index_tensor(write, dev)
            self._native = None
        # the PyTorch path's plans, made at its first layer (the kernel needs none of them)
        self._chunks: list[tuple[Tensor, int, Tensor]] | None = None
        self._decode: list[tuple[Tensor, Tensor, int, Tensor]] | None = None
        self._window = 0  # tokens the PyTorch path gathers at once
        self._bounds_checked = self._native is not None  # the kernel's tables and lens range-checked
        self._write_checked = self._native is not None  # the write rows range-checked

    def _native_plan(self) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
        """What the C kernel (``tinyllm/native.py``) needs to attend every token of the step in
        one call, reading the pool in place, with the tokens' positions and write rows: per
        token, its position, pool row, length (its position + 1: a chunk's tokens are causal
        from its start) and table, the tables being the pool's own (``table_rows``: its slot's
        row). None where it cannot run (not CPU, a pool dtype it does not read, no compiler).
        Built once per step, in C, range-checked as it is built, shared by every layer."""
        pool = self.pool
        if not self.items or pool.device.type != "cpu" or pool.k.dtype not in native.POOL_DTYPES:
            return None
        # (the pool's real blocks only: past a table's end it holds n_blocks, the scratch block)
        n_blocks = min(pool.n_blocks, pool.k.size(1) // pool.block_size)
        rows = native.ragged_rows(self.items, pool.table_rows, pool.block_size, n_blocks, self.total)
        return None if rows is None else tuple(rows)

    def _decode_plan(self) -> list[tuple[Tensor, Tensor, int, Tensor]]:
        """The decode rows in groups of similar length, each (rows, block ids, window W, additive
        mask (rows, 1, W): 0 where the row may attend, -inf past its position). Rows are sorted by
        block count and cut into groups of at most ``GROUP_TOKENS`` window tokens, so a short row
        is not padded to the longest one's window (on a ragged batch, one window for all rows
        gathered and multiplied twice the K/V it needed), and a group's gathered K/V is still in
        cache when its matmuls read it. Built once per step, shared by every layer."""
        dev, bs, scratch = self.pool.device, self.pool.block_size, self.pool.scratch
        dec = self.items[: self.n_decode]
        need = [start // bs + 1 for _, start, _ in dec]  # blocks each row attends
        order = sorted(range(len(dec)), key=lambda i: -need[i])
        groups = []
        while order:
            nb = need[order[0]]
            take = max(1, GROUP_TOKENS // (nb * bs))
            rows, order = order[:take], order[take:]
            table = [self.pool.tables[dec[i][0]][: need[i]] + [scratch] * (nb - need[i]) for i in rows]
            ends = torch.tensor([dec[i][1] for i in rows], dtype=torch.long, device=dev)
            past = torch.arange(nb * bs, device=dev)[None, :] > ends[:, None]
            mask = torch.zeros(past.shape, dtype=self.pool.k.dtype, device=dev).masked_fill_(past, float("-inf"))
            groups.append(
                (
                    torch.tensor(rows, dtype=torch.long, device=dev),
                    torch.tensor(table, dtype=torch.long, device=dev).reshape(-1),
                    nb * bs,
                    mask[:, None, :],
                )
            )
        return groups

    def _chunk_plan(self, slot: int, start: int, n: int) -> tuple[Tensor, int, Tensor]:
        """Block ids of positions 0..start+n-1, their length L, and a causal mask (1, 1, n, L)
        offset by ``start``."""
        dev, bs = self.pool.device, self.pool.block_size
        L = start + n
        blocks = torch.tensor(self.pool.tables[slot][: -(-L // bs)], dtype=torch.long, device=dev)
        q_pos = torch.arange(start, L, device=dev)
        mask = (torch.arange(L, device=dev)[None, :] <= q_pos[:, None])[None, None]
        return blocks, L, mask

    def native_attention(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor] | None:
        """What ``csrc/decoder_layer.c`` needs to store and attend every layer's tokens in C, its
        ranges checked (as ``_native_plan`` built them): each token's pool row, then the kernel's
        tables, lens and row_table. None where the kernel cannot run (the model then runs its
        layers one op at a time)."""
        return None if self._native is None else (self._write, *self._native)

    # -- AttentionCache protocol ----------------------------------------------------------------
    def begin(self, batch: int, n_new: int) -> Tensor:
        if batch != 1 or n_new != self.total:
            raise ValueError(f"RaggedAttention runs one flattened batch of {self.total} tokens, got {batch} x {n_new}")
        return self._pos[None, :]

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        kl, vl = self.pool.k[layer], self.pool.v[layer]  # (rows, Hkv, D)
        k_new, v_new = k[0].transpose(0, 1), v[0].transpose(0, 1)  # (T, Hkv, D)
        if native.kv_store(k_new, v_new, self._write, kl, vl, bounds_checked=self._write_checked):
            self._write_checked = True  # the same rows every layer
        else:
            kl.index_copy_(0, self._write, k_new.to(kl.dtype))  # index_copy_: a plain row copy,
            vl.index_copy_(0, self._write, v_new.to(vl.dtype))  # cheaper than index_put_
        if self._native is not None and native.usable(q, kl):  # every token in one C call
            tables, lens, row_table = self._native
            out = native.decode_attention(
                q[0],
                kl,
                vl,
                tables,
                lens,
                self.pool.block_size,
                bounds_checked=self._bounds_checked,
                row_table=row_table,
            )
            self._bounds_checked = True  # the same tables and lens every layer
            return out[None]
        return self._attend_torch(q, kl, vl)

    def _attend_torch(self, q: Tensor, kl: Tensor, vl: Tensor) -> Tensor:
        """PyTorch's path (CUDA, no compiler, autograd): the decode rows in length groups, each
        prefill chunk by gather + SDPA. Its plans are made at the first layer that runs it."""
        nd, bs = self.n_decode, self.pool.block_size
        if self._decode is None:
            self._decode = self._decode_plan() if nd else []
            self._chunks = [self._chunk_plan(slot, start, n) for slot, start, n in self.items[nd:]]
            self._window = max(
                [rows.numel() * W for rows, _, W, _ in self._decode]
                + [blocks.numel() * bs for blocks, _, _ in self._chunks],
                default=0,
            )
        kbuf, vbuf = self.pool.workspace(self._window) if self._window else (None, None)
        outs = []
        if nd:
            outs.append(self._attend_decodes(q[0, :, :nd], kl, vl, kbuf, vbuf)[None])
        off = nd
        for (_, _, n), (blocks, L, mask) in zip(self.items[nd:], self._chunks):
            qc = q[:, :, off : off + n]  # (1, H, n, D)
            keys = gather_blocks(kl, blocks, bs, kbuf)[:L].transpose(0, 1)[None].to(q.dtype)  # (1, Hkv, L, D)
            vals = gather_blocks(vl, blocks, bs, vbuf)[:L].transpose(0, 1)[None].to(q.dtype)
            outs.append(grouped_attention(qc, keys, vals, mask))
            off += n
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

    def _attend_decodes(self, q: Tensor, kl: Tensor, vl: Tensor, kbuf: Tensor, vbuf: Tensor) -> Tensor:
        """The decode rows' attention, (H, nd, D) from q (H, nd, D), group by group: gather the
        group's blocks, then per KV head two batched matmuls over its rows (scores, then the
        weighted values), reading the gathered K/V in place through strides. On CPU this is
        faster than the fused SDPA kernel: with one query per row that kernel's tiling costs more
        than the arithmetic, and it wants the K/V heads transposed (a copy)."""
        bs = self.pool.block_size
        H, D = q.size(0), q.size(-1)
        Hkv = kl.size(1)
        g = H // Hkv
        out = torch.empty_like(q)
        for rows, blocks, W, mask in self._decode:
            r = rows.numel()
            qg = q.index_select(1, rows)  # (H, r, D)
            keys = gather_blocks(kl, blocks, bs, kbuf).view(r, W, Hkv, D).to(q.dtype)
            vals = gather_blocks(vl, blocks, bs, vbuf).view(r, W, Hkv, D).to(q.dtype)
            og = torch.empty_like(qg)
            for h in range(Hkv):  # the g query heads sharing KV head h
                qh = qg[h * g : (h + 1) * g].transpose(0, 1)  # (r, g, D)
                scores = torch.baddbmm(mask.to(q.dtype), qh, keys[:, :, h].transpose(1, 2), alpha=D**-0.5)
                og[h * g : (h + 1) * g] = torch.bmm(torch.softmax(scores, dim=-1), vals[:, :, h]).transpose(0, 1)
            out.index_copy_(1, rows, og)
        return out

    def end(self, n_new: int) -> None:
        for slot, start, n in self.items:
            self.pool.lens[slot] = start + n
        self.pool._dirty = True
