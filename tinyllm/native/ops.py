"""The model's small kernels (RMSNorm, RoPE, the K/V store, argmax, SwiGLU, the packed linear
layer, the whole decoder stack): each answers None or False where it cannot run."""

from __future__ import annotations

import ctypes
import math

import torch
from torch import Tensor

from tinyllm import native
from tinyllm.native.abi import LayerStep, raise_for
from tinyllm.native.attention import POOL_DTYPES, check_range


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor | None:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim, in one C pass per row; None where
    it cannot run (not CPU float32, autograd recording, no library): the caller uses PyTorch.
    Called twice per layer and step: the checks are the cheap ones (~10 us here; each reshape,
    view or device object would add microseconds to a pass that itself takes a few)."""
    lib = native.library()
    if (
        lib is None
        or not (x.is_cpu and weight.is_cpu)
        or x.dtype != torch.float32
        or weight.dtype != torch.float32
        or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    ):
        return None
    D = x.shape[-1]
    if D == 0 or weight.shape != (D,) or not weight.is_contiguous():
        return None
    if not x.is_contiguous():
        x = x.contiguous()
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    lib.rms_norm(x.data_ptr(), D, weight.data_ptr(), out.data_ptr(), D, x.numel() // D, D, eps)
    return out


def plain(*ts: Tensor, dtypes: tuple[torch.dtype, ...] = (torch.float32,)) -> bool:
    """CPU tensors of ``dtypes`` (float32) autograd is not recording: what the small kernels take."""
    grad = torch.is_grad_enabled()
    return all(
        t.is_cpu
        and t.dtype in dtypes
        and not (grad and t.requires_grad)
        and t.layout == torch.strided
        and not t._is_zerotensor()
        for t in ts
    )  # real memory to read


def rope_(heads: Tensor, pos: Tensor, cos: Tensor, sin: Tensor, n_rotated: int, bounds_checked: bool = False) -> bool:
    """The rotary embedding, in place, on the first ``n_rotated`` heads of each token of ``heads``
    (B, T, heads, D), head dim contiguous (the fused qkv projection's output viewed by head: q and
    k rotate, v does not); ``pos`` (B, T) int64 rows of the (max_len, D) tables ``cos``/``sin``.
    False where it cannot run (the caller rotates with PyTorch). ``bounds_checked``: these
    positions were range-checked already (they are the same for every layer of a forward)."""
    lib = native.library()
    if lib is None or heads.dim() != 4 or not plain(heads, cos, sin):
        return False
    B, T, n_heads, D = heads.shape
    if pos.dim() == 2 and not pos.is_contiguous():  # e.g. arange(T).expand(B, T)
        pos = pos.contiguous()
    if (
        D % 2
        or not 0 <= n_rotated <= n_heads
        or heads.stride(3) != 1
        or heads.stride(2) != D
        or heads.stride(0) != T * heads.stride(1)
        or (B * T > 1 and heads.stride(1) < n_heads * D)
        or pos.shape != (B, T)
        or pos.dtype != torch.int64
        or not (pos.is_cpu and pos.is_contiguous() and cos.is_contiguous() and sin.is_contiguous())
        or cos.dim() != 2
        or cos.shape != sin.shape
        or cos.size(1) != D
    ):
        return False
    if not bounds_checked and pos.numel():
        check_range(pos, cos.size(0), "rotary positions", " (max_seq_len)")
    lib.rope_inplace(
        heads.data_ptr(), heads.stride(1), B * T, n_rotated, D, pos.data_ptr(), cos.data_ptr(), sin.data_ptr()
    )
    return True


def kv_store(k: Tensor, v: Tensor, write: Tensor, k_pool: Tensor, v_pool: Tensor, bounds_checked: bool = False) -> bool:
    """``k_pool[write] = k`` and ``v_pool[write] = v`` in one call: k, v (T, Hkv, D) float32 with each
    token's (Hkv, D) contiguous and the same strides; pools (rows, Hkv, D) contiguous, float32 or
    bfloat16 (rounded as ``.to(torch.bfloat16)`` rounds); write (T,) int64 pool rows. False where it
    cannot run (the caller copies with PyTorch). ``bounds_checked``: these write rows were
    range-checked against a pool as large already (every layer of a step shares them)."""
    lib = native.library()
    if lib is None or not plain(k, v) or not plain(k_pool, v_pool, dtypes=POOL_DTYPES) or v_pool.dtype != k_pool.dtype:
        return False
    T = k.size(0)
    if (
        k.dim() != 3
        or k.shape != v.shape
        or k.stride() != v.stride()
        or k.shape[1:] != k_pool.shape[1:]
        or k_pool.shape != v_pool.shape
        or not (k_pool.is_contiguous() and v_pool.is_contiguous())
        or k.stride(2) != 1
        or k.stride(1) != k.size(2)
        or write.shape != (T,)
        or write.dtype != torch.int64
        or not (write.is_cpu and write.is_contiguous())
    ):
        return False
    if not bounds_checked and T:
        check_range(write, k_pool.size(0), "KV write rows")
    lib.kv_store(
        k.data_ptr(),
        v.data_ptr(),
        k.stride(0),
        T,
        k.size(1) * k.size(2),
        write.data_ptr(),
        k_pool.data_ptr(),
        v_pool.data_ptr(),
        k_pool.dtype == torch.bfloat16,
    )
    return True


def argmax(x: Tensor) -> Tensor | None:
    """Each row's argmax, (rows, 1) int64, as ``x.argmax(dim=-1, keepdim=True)`` (first index of
    the largest value; of the first NaN where there is one); None where it cannot run."""
    lib = native.library()
    if lib is None or x.dim() != 2 or x.size(1) == 0 or not plain(x) or x.stride(1) != 1:
        return None
    out = torch.empty(x.size(0), 1, dtype=torch.int64)
    lib.argmax_rows(x.data_ptr(), x.stride(0), x.size(0), x.size(1), out.data_ptr())
    return out


def silu_mul(gate_up: Tensor) -> Tensor | None:
    """silu(gate) * up from (..., 2F) holding gate then up (the fused projection's output):
    (..., F), one pass; None where it cannot run."""
    lib = native.library()
    if lib is None or gate_up.dim() < 1 or gate_up.size(-1) % 2 or not plain(gate_up):
        return None
    if not gate_up.is_contiguous():
        gate_up = gate_up.contiguous()
    F = gate_up.size(-1) // 2
    out = torch.empty(*gate_up.shape[:-1], F, dtype=torch.float32)
    if F:
        lib.silu_mul(gate_up.data_ptr(), 2 * F, gate_up.numel() // (2 * F), F, out.data_ptr())
    return out


PANEL = 16  # output columns per packed panel (linear.c's NR)


def pack_linear(w: Tensor) -> Tensor | None:
    """W (N, K), as nn.Linear holds it, in ``linear``'s layout: ceil(N/16) panels of (K, 16), zero
    past N. None where the kernels cannot run (the caller keeps its other path)."""
    lib = native.library()
    if lib is None or w.dim() != 2 or not plain(w):
        return None
    w = w.detach().contiguous()
    N, K = w.shape
    packed = torch.empty(-(-N // PANEL), K, PANEL, dtype=torch.float32)
    lib.pack_linear_weight(w.data_ptr(), N, K, packed.data_ptr())
    return packed


def linear(x: Tensor, packed: Tensor, n_out: int, add: Tensor | None = None) -> Tensor | None:
    """x (..., K) times the packed weight's transpose: (..., n_out), plus ``add`` (..., n_out) when
    given (a residual, added after the sum: the bits of adding it afterwards). Each output is a sum
    over k in order, so a row's result does not depend on the other rows of the call. None where it
    cannot run (not CPU float32, autograd recording, no library, shapes that do not match the
    packed weight)."""
    lib = native.library()
    if lib is None or x.dim() < 1 or not plain(x, packed):
        return None
    K = x.size(-1)
    if (
        packed.dim() != 3
        or packed.shape != (-(-n_out // PANEL), K, PANEL)
        or not packed.is_contiguous()
        or (add is not None and (add.shape != (*x.shape[:-1], n_out) or not plain(add)))
    ):
        return None
    if not x.is_contiguous():
        x = x.contiguous()
    if add is not None and not add.is_contiguous():
        add = add.contiguous()
    M = math.prod(x.shape[:-1])
    out = torch.empty(*x.shape[:-1], n_out, dtype=torch.float32)
    if M and n_out:
        lib.linear_packed(
            x.data_ptr(),
            K,
            M,
            K,
            packed.data_ptr(),
            n_out,
            out.data_ptr(),
            n_out,
            None if add is None else add.data_ptr(),
            n_out,
            torch.get_num_threads(),
        )
    return out


def decoder_layers(weights: ctypes.Array, step: LayerStep, x: Tensor, norm: Tensor, eps: float) -> Tensor:
    """Every layer (``weights``: an array of LayerWeights) over x (tokens, d) float32 contiguous,
    then the final RMSNorm (``norm``, ``eps``), in one C call: a new tensor like x (x is only
    read). It trusts every pointer and size in ``weights`` and ``step``: ``model/c_layers.py``
    fills them from tensors it has checked (the one caller)."""
    a, b = torch.empty_like(x), torch.empty_like(x)  # the layers take turns writing these
    raise_for(
        native.library().decoder_layers(
            weights, len(weights), ctypes.byref(step), x.data_ptr(), a.data_ptr(), b.data_ptr(), norm.data_ptr(), eps
        )
    )
    return b if len(weights) % 2 else a
