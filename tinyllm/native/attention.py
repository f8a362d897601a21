"""The paged attention kernel's wrappers: whether it can run, every argument it trusts checked
(index ranges included, in one C pass), and a ragged step's rows built for it."""

from __future__ import annotations

from array import array

import torch
from torch import Tensor

from tinyllm import native
from tinyllm.native.abi import raise_for

POOL_DTYPES = (torch.float32, torch.bfloat16)  # the K/V pool element types the kernels read and write


def usable(q: Tensor, pool: Tensor) -> bool:
    """The kernel can run this attention: CPU, float32 query, a float32 or bfloat16 pool, not
    recording autograd (it has no backward)."""
    return (
        q.device.type == "cpu"
        and pool.device.type == "cpu"
        and q.dtype == torch.float32
        and pool.dtype in POOL_DTYPES
        and not (torch.is_grad_enabled() and q.requires_grad)
        and native.library() is not None
    )


def check_arguments(q, k, v, tables, lens, block_size, bounds=True, row_table=None) -> None:
    """``decode_attention``'s arguments (typed there; ``bounds`` is ``not bounds_checked``).
    Everything the C code trusts, checked here: it reads raw pointers, so a wrong dtype, shape
    or block id would read out of bounds (a crash, or silently wrong attention) instead of raising.
    ``bounds=False`` skips the lengths', block ids' and table numbers' ranges (reductions, ~30 us):
    for the layers after the first of a step, which share its tables and lens."""
    H, rows, D = q.shape
    problems = []
    if not (q.is_cpu and k.is_cpu and v.is_cpu and tables.is_cpu and lens.is_cpu):
        problems.append("every tensor on the CPU")
    if not (q.dtype == torch.float32 and k.dtype == v.dtype and k.dtype in POOL_DTYPES):
        problems.append(f"a float32 q and a float32 or bfloat16 k/v (got {q.dtype}, {k.dtype}, {v.dtype})")
    if tables.dtype != torch.int64 or lens.dtype != torch.int64:
        problems.append(f"int64 tables and lens (got {tables.dtype}, {lens.dtype})")
    if k.dim() != 3 or k.shape != v.shape or k.size(2) != D or H % k.size(1):
        problems.append(
            f"k, v of shape (tokens, Hkv, {D}) with Hkv dividing {H} (got {tuple(k.shape)}, {tuple(v.shape)})"
        )
    if not (k.is_contiguous() and v.is_contiguous() and tables.is_contiguous() and lens.is_contiguous()):
        problems.append("contiguous pool, tables and lens")
    if row_table is not None and (
        row_table.dtype != torch.int64
        or row_table.shape != (rows,)
        or not (row_table.is_cpu and row_table.is_contiguous())
    ):
        problems.append(f"a contiguous int64 row_table ({rows},) on the CPU")
    elif (
        tables.dim() != 2
        or (tables.size(0) != rows if row_table is None else rows and not tables.size(0))
        or lens.shape != (rows,)
    ):
        problems.append(f"tables ({rows if row_table is None else 'n'}, width) and lens ({rows},)")
    elif rows and bounds:
        problems += plan_range_problems(tables, lens, row_table, k.size(0) // block_size, block_size)
    if problems:
        raise ValueError(_ATTENTION_NEEDS + "; ".join(problems))


_ATTENTION_NEEDS = "paged decode attention needs "


def plan_range_problems(
    tables: Tensor, lens: Tensor, row_table: Tensor | None, n_blocks: int, block_size: int
) -> list[str]:
    """What is out of range in an attention plan (non-empty, shapes already checked): lengths
    past the tables' width, block ids past the pool, table numbers past the tables."""
    if not in_range(lens, 1, tables.size(1) * block_size):
        return [f"lens in 1..{tables.size(1) * block_size} (the table's width x block_size)"]
    if not in_range(tables, 0, n_blocks - 1):
        return [f"block ids in 0..{n_blocks - 1}"]
    if row_table is not None and not in_range(row_table, 0, tables.size(0) - 1):
        return [f"row_table entries in 0..{tables.size(0) - 1} (the tables' rows)"]
    return []


def check_range(ix: Tensor, n: int, what: str, why: str = "") -> None:
    """Every entry of ``ix`` (int64, non-empty) in 0..n-1, or a ValueError naming ``what`` (and
    ``why`` that range): the indices a kernel would write or read through without looking."""
    if not in_range(ix, 0, n - 1):
        raise ValueError(f"{what} must be in 0..{n - 1}{why}, got {int(ix.min())}..{int(ix.max())}")


def in_range(ix: Tensor, lo: int, hi: int) -> bool:
    """Every entry of ``ix`` (int64) in lo..hi: one pass in C (``ranges.c``) on a contiguous CPU
    tensor, else a PyTorch min and max."""
    lib = native.library()
    if lib is not None and ix.dtype == torch.int64 and ix.device.type == "cpu" and ix.is_contiguous():
        return lib.first_outside(ix.data_ptr(), ix.numel(), lo, hi) < 0
    return not ix.numel() or (int(ix.min()) >= lo and int(ix.max()) <= hi)


def decode_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    tables: Tensor,
    lens: Tensor,
    block_size: int,
    bounds_checked: bool = False,
    row_table: Tensor | None = None,
) -> Tensor:
    """Attention over a paged pool, read in place, one query token per row: a decode row, or one
    token of a prefill chunk (the chunk's tokens share their sequence's table, with lengths
    start+1 .. start+n: causal attention).

    q: (H, rows, D), last dim contiguous; k, v: one layer's pool (tokens, Hkv, D), contiguous;
    tables: (rows, width) int64 block ids, every entry a valid block (pad a short row with any, e.g.
    the pool's scratch block: entries past a row's length are never read), or (n, width) with
    ``row_table`` (rows,) int64 naming each row's table; lens: (rows,) int64, the positions each
    row attends (0 .. lens-1, through its table), each at least 1. Checked
    (``check_arguments``): a ValueError, never an out-of-bounds read. ``bounds_checked``: the
    ranges of these same tables, lens and row_table were checked by an earlier call (on a pool as large).
    Returns (H, rows, D): a view of a (rows, H, D) tensor, so the model's transpose back to
    token-major costs no copy."""
    H, rows, D = q.shape
    check_arguments(q, k, v, tables, lens, block_size, bounds=not bounds_checked, row_table=row_table)
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty(rows, H, D, dtype=q.dtype, device=q.device)
    rc = native.library().paged_decode_attention(
        q.data_ptr(),
        q.stride(1),
        q.stride(0),
        k.data_ptr(),
        v.data_ptr(),
        tables.data_ptr(),
        tables.size(1),
        None if row_table is None else row_table.data_ptr(),
        lens.data_ptr(),
        out.data_ptr(),
        out.stride(0),
        out.stride(1),
        rows,
        H,
        k.size(1),
        D,
        block_size,
        D**-0.5,
        torch.get_num_threads(),
        k.dtype == torch.bfloat16,
    )
    raise_for(rc)
    return out.transpose(0, 1)


def ragged_rows(
    items: list[tuple[int, int, int]], tables: Tensor, block_size: int, n_blocks: int, total: int
) -> Tensor | None:
    """A ragged step's rows (``ragged_rows.c``): ``items`` (slot, start, n), ``total`` their n's
    sum, ``tables`` (slots, width) int64 block ids, each slot's table in its row (past its end:
    any id outside 0..n_blocks-1), over a pool of ``n_blocks`` blocks. (4, total) int64: each
    token's position, pool row to write, length to attend (position + 1) and table (its slot);
    None where the library cannot run. Range-checked as it is built (every block id a token reads
    or writes is in the pool): a ValueError names what is wrong, so the kernels may trust what
    it returns."""
    lib = native.library()
    if (
        lib is None
        or not items
        or tables.dtype != torch.int64
        or tables.dim() != 2
        or not tables.is_cpu
        or not tables.is_contiguous()
    ):
        return None
    if block_size < 1 or n_blocks < 1 or tables.size(1) * block_size >= 2**62:
        raise ValueError(
            f"ragged rows need block_size >= 1 and n_blocks >= 1 (tables of width {tables.size(1)}), "
            f"got {block_size} and {n_blocks}"
        )
    slots, starts, ns = (array("q", column) for column in zip(*items))
    out = torch.empty(4, total, dtype=torch.int64)
    at = out.data_ptr()
    bad = lib.ragged_rows(
        slots.buffer_info()[0],
        starts.buffer_info()[0],
        ns.buffer_info()[0],
        len(items),
        tables.data_ptr(),
        tables.size(0),
        tables.size(1),
        block_size,
        n_blocks,
        total,
        at,
        at + 8 * total,
        at + 16 * total,
        at + 24 * total,
    )
    if bad > len(items):
        raise ValueError(f"ragged items hold {sum(ns)} tokens, not the {total} given")
    if bad:
        i = abs(bad) - 1
        slot, start, n = items[i]
        if bad < 0:
            raise ValueError(
                f"ragged item {i} (slot {slot}, positions {start}..{start + n - 1}): its block table "
                f"does not hold one of the pool's blocks (0..{n_blocks - 1}) for each of positions "
                f"0..{start + n - 1}: {tables[slot].tolist()}"
            )
        raise ValueError(
            f"ragged item {i} (slot {slot}, positions {start}..{start + n - 1}) is outside the block "
            f"tables: slots 0..{tables.size(0) - 1}, positions 0..{tables.size(1) * block_size - 1}, "
            f"at least one token"
        )
    return out
