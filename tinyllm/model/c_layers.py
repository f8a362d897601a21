"""A ragged step's decoder layers and final norm in one C call (``csrc/decoder_layer.c``).

On CPU the model's layer is a dozen C kernels called from Python (``transformer.Block``); between
them, each wrapper's checks, views and allocations cost ~0.5 ms a layer on this project's machine:
~2 ms of a 4.5 ms one-row step of the d256 model, ~3 ms of a 15 ms 64-row one. Here every layer,
then the model's final RMSNorm, is one call that runs the same kernels in the same order on the
same buffers, so the same bits (tested): ``Block`` stays the one definition of the layer, this is
how it runs when nothing needs Python in between. (One call for all of them, not one a layer:
with the caches cold after a layer's weights went through, each call, allocation and Python line
between them cost several times what it costs warm.)

It applies where every op of the layer would have run on the kernels anyway: CPU float32 without
autograd or autocast, exactly ``transformer.Block``'s modules (no subclass, no hooks), the packed
C linear layers without bias, and the paged pool's ragged batch (``kv.ragged.RaggedAttention``,
the token-budget engine's forward). ``CLayers.plan`` checks that, the sizes the C reads by and
the rotary positions, once per forward, and answers None otherwise (the model then loops over its
blocks as before); the attention's index ranges (write rows, tables, lengths) were checked as the
ragged batch built them (``csrc/ragged_rows.c``).

A layer's weights (pointers to its packed matrices, norms and pool) are kept between forwards and
reused while nothing they came from changed: the same modules, their weights the same tensors at
the same versions and addresses (what ``Linear`` repacks on), the same eps, no bias, the same pool
layer. On this machine each ``module.attribute`` lookup costs ~1.5 us, and re-reading every
layer's weights took ~0.8 ms a forward, so the parts are read through the modules' own
dictionaries. The layers together (their C array, the shapes checked across them) are kept too,
by the blocks' container (``_Frame``), while the same blocks run over the same pool: each forward
then checks each layer is ``still`` what it was, and builds only what changes from step to step
(the positions, the attention plan, the scratch).
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn.modules import module as torch_module

from tinyllm import native


class _Layer:
    """One block's LayerWeights, the tensors they point into, and what they were made from."""

    def __init__(
        self,
        block: nn.Module,
        parts: tuple[nn.Module, ...],
        seen: list[tuple[Tensor, int, int]],
        where: tuple[int, int, int],
        weights: native.LayerWeights,
        widths: tuple[int, ...],
        eps: float,
        keep: list[Tensor],
    ):
        self.parts, self.seen, self.where = parts, seen, where  # parts: the block's modules but itself
        self.weights, self.widths, self.eps, self._keep = weights, widths, eps, keep
        attn, mlp, qkv, o, gate_up, down, norm1, norm2 = parts
        # what ``still`` looks at, gathered once: every module's hook dicts (a hook is added to
        # them in place), the three dicts naming the parts, the six holding weights
        self._hooks = tuple(h for m in (block, *parts) for h in (m._forward_hooks, m._forward_pre_hooks))
        self._named = (block._modules, attn._modules, mlp._modules)
        self._params = tuple(m._parameters for m in (qkv, o, gate_up, down, norm1, norm2))
        self.attention = (attn.n_heads, attn.n_kv_heads, attn.head_dim, attn.layer_idx)

    def still(self, block: nn.Module, where: tuple[int, int, int]) -> bool:
        """Made from what ``block`` holds now, for the same pool layer: the same modules in the same
        places, of the same classes (a parametrization, say, swaps a module's class), without
        hooks, the attention's heads and layer index as they were; their weights the same tensors
        at the same versions and addresses, no bias, the same eps. (A step asks for each layer:
        ~40 us a layer with the caches cold, so as few Python steps as it can.)"""
        if where != self.where or any(self._hooks) or (type(block), *map(type, self.parts)) != _kinds():
            return False
        attn, mlp, qkv, o, gate_up, down, norm1, norm2 = self.parts
        mods, at, mm = self._named
        if not (block._modules is mods and attn._modules is at and mlp._modules is mm):
            return False
        try:
            if not (
                mods["self_attn"] is attn
                and mods["mlp"] is mlp
                and mods["input_layernorm"] is norm1
                and mods["post_attention_layernorm"] is norm2
                and at["qkv_proj"] is qkv
                and at["o_proj"] is o
                and mm["gate_up_proj"] is gate_up
                and mm["down_proj"] is down
            ):
                return False
        except KeyError:
            return False
        for params, (w, version, ptr) in zip(self._params, self.seen):
            now = params.get("weight")
            if now is not w or now._version != version or now.data_ptr() != ptr or params.get("bias") is not None:
                return False
        return (
            norm1.eps == self.eps
            and norm2.eps == self.eps
            and (attn.n_heads, attn.n_kv_heads, attn.head_dim, attn.layer_idx) == self.attention
        )


_layers: weakref.WeakKeyDictionary[nn.Module, _Layer] = weakref.WeakKeyDictionary()


_KINDS: tuple[type, ...] = ()  # the classes of a Block's modules, in _parts' order


def register_block_kinds(kinds: tuple[type, ...]) -> None:
    """The transformer's classes of a Block's modules (Block, Attention, MLP, the four linear layers,
    the two norms), in ``_parts``' order: transformer.py registers them, so this module never
    imports it (transformer imports this one)."""
    global _KINDS
    _KINDS = kinds


def _kinds() -> tuple[type, ...]:
    return _KINDS


def _parts(block: nn.Module) -> tuple[tuple[nn.Module, ...], list[nn.Module], list[nn.Module]] | None:
    """Every module of the block (itself, attention, MLP, four linear layers, two norms), its linear
    layers and its norms, if it is exactly ``transformer.Block``'s layout; None otherwise."""
    try:
        mods = block._modules
        attn, mlp = mods["self_attn"], mods["mlp"]
        linears = [
            attn._modules["qkv_proj"],
            attn._modules["o_proj"],
            mlp._modules["gate_up_proj"],
            mlp._modules["down_proj"],
        ]
        norms = [mods["input_layernorm"], mods["post_attention_layernorm"]]
    except (KeyError, AttributeError):
        return None
    modules = (block, attn, mlp, *linears, *norms)
    if tuple(map(type, modules)) != _kinds():  # a subclass may compute otherwise
        return None
    return modules, linears, norms


def _layer(block: nn.Module, index: int, k: int, v: int) -> _Layer | None:
    """The block's C weights over its pool layer (K and V at addresses k, v), reused while nothing
    they came from changed (``_Layer.still``); None where a part would not run on the kernels, or
    a hook wants to see it run."""
    where = (index, k, v)
    cached = _layers.get(block)
    if cached is not None:
        if cached.still(block, where):
            return cached
        del _layers[block]  # (not kept: it holds the old weights' packed copies)
    parts = _parts(block)
    if parts is None:
        return None
    modules, linears, norms = parts
    if any(m._forward_hooks or m._forward_pre_hooks for m in modules):
        return None
    packed = [lin.c_packed() for lin in linears]
    d = norms[0].weight.numel()
    if (
        any(p is None for p in packed)
        or norms[0].eps != norms[1].eps
        or any(n.weight.shape != (d,) or not n.weight.is_contiguous() or not native.plain(n.weight) for n in norms)
    ):
        return None
    # held: the packed copies the pointers name, and what they were packed from (so no new weight
    # can take that address and match); not the pool (the same address means the same layer), nor
    # the block itself (the cache's key: held, it would never be collected)
    weights = [m._parameters["weight"] for m in (*linears, *norms)]
    layer = _Layer(
        block,
        modules[1:],
        [(w, w._version, w.data_ptr()) for w in weights],
        where,
        native.LayerWeights(*(n.weight.data_ptr() for n in norms), *(w.data_ptr() for w, _ in packed), k, v),
        (*(x for w, n_out in packed for x in (n_out, w.size(1))), d),
        norms[0].eps,
        [n.weight for n in norms] + [w for w, _ in packed] + [lin._packed_src for lin in linears],
    )
    _layers[block] = layer
    return layer


class _Frame:
    """The layers of one forward's plan, kept for the next ones: each layer's ``_Layer``, the C
    array of their weights and the shapes checked across them. Valid while the same blocks run
    over the same pool and every layer is ``still`` what it was made from (checked each forward:
    building the array and checking the shapes again cost ~0.2 ms a step, with the caches cold)."""

    def __init__(
        self,
        blocks: list[nn.Module],
        where: tuple[int, int, int],
        layers: list[_Layer],
        dims: tuple[int, int, int, int, float],
    ):
        # blocks: held (the key is their container, so the frame goes with the model)
        self.blocks, self.where, self.layers, self.dims = blocks, where, layers, dims  # dims: H, Hkv, D, F, eps
        self.width = layers[0].widths[-1]  # the model's (the norms')
        self.weights = (native.LayerWeights * len(layers))(*(layer.weights for layer in layers))

    def still(self, blocks: Sequence[nn.Module], where: tuple[int, int, int]) -> bool:
        if where != self.where or len(blocks) != len(self.blocks):
            return False
        k0, v0, layer_bytes = where
        for i, (block, was, layer) in enumerate(zip(blocks, self.blocks, self.layers)):
            if block is not was or not layer.still(block, (i, k0 + i * layer_bytes, v0 + i * layer_bytes)):
                return False
        return True


_frames: weakref.WeakKeyDictionary[nn.Module, _Frame] = weakref.WeakKeyDictionary()


def _frame(blocks: Sequence[nn.Module], pool) -> _Frame | None:
    """The layers of ``blocks`` over the pool's layers (one each, in order), checked to share one
    shape and one eps, each at its own pool layer; kept (by the blocks' container) while they
    are ``still`` what they were. None where a layer would not run on the kernels."""
    k0, v0 = pool.k.data_ptr(), pool.v.data_ptr()
    layer_bytes = pool.k.stride(0) * pool.k.element_size()  # (no views: ~5 us each)
    where = (k0, v0, layer_bytes)
    try:
        kept = _frames.get(blocks)
    except TypeError:  # a plain list: not weakly referable, not kept
        kept = None
    if kept is not None:
        if kept.still(blocks, where):
            return kept
        del _frames[blocks]  # (not kept: it holds the old blocks and their weights)
    layers = [_layer(b, i, k0 + i * layer_bytes, v0 + i * layer_bytes) for i, b in enumerate(blocks)]
    if any(layer is None for layer in layers):
        return None
    attn = layers[0].parts[0]  # (blocks[i].self_attn, checked by _layer)
    H, Hkv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
    F, d = layers[0].widths[7], layers[0].widths[-1]  # the down projection's input width; the model's
    widths = ((H + 2 * Hkv) * D, d, d, H * D, 2 * F, d, d, F, d)  # (rows, K) of qkv, o, gate_up, down; norms
    if any(layer.widths != widths or layer.eps != layers[0].eps for layer in layers):
        return None
    if any(layer.attention != (H, Hkv, D, i) for i, layer in enumerate(layers)):  # each at its own pool layer
        return None
    frame = _Frame(list(blocks), where, layers, (H, Hkv, D, F, layers[0].eps))
    try:
        _frames[blocks] = frame
    except TypeError:
        pass
    return frame


class CLayers:
    """One forward's decoder layers and final norm, ready to run in C: ``run(x)`` is the model's
    blocks then its norm over ``x``."""

    def __init__(self, weights: ctypes.Array, step: native.LayerStep, norm: Tensor, eps: float, keep: list[Tensor]):
        self.weights, self.step, self.norm, self.eps = weights, step, norm, eps
        self._keep = keep  # every tensor the step points into, alive while it is

    @classmethod
    def plan(cls, blocks: Sequence[nn.Module], norm: nn.Module, x: Tensor, rotary, cache) -> CLayers | None:
        """The plan for ``blocks`` (``transformer.Block``) and the final ``norm`` (``RMSNorm``) over
        ``x`` (1, T, d), or None where a part would not run entirely on the kernels."""
        attention = getattr(cache, "native_attention", None)
        if (
            attention is None
            or not blocks
            or native.library() is None
            or torch.is_grad_enabled()
            or torch.is_autocast_enabled("cpu")
            or x.dim() != 3
            or x.size(0) != 1
            or not x.is_contiguous()
            or not native.plain(x)
            or torch_module._global_forward_hooks
            or torch_module._global_forward_pre_hooks
        ):
            return None
        T, d = x.size(1), x.size(2)
        norm_w = norm._parameters.get("weight") if type(norm) is _kinds()[-1] else None
        if (
            norm_w is None
            or norm._forward_hooks
            or norm._forward_pre_hooks
            or norm_w.shape != (d,)
            or not norm_w.is_contiguous()
            or not native.plain(norm_w)
        ):
            return None
        plan = attention()  # None off the kernel; else range-checked, once a step
        if plan is None:
            return None
        pool = cache.pool
        if (
            pool.k.size(0) < len(blocks)
            or pool.k.dtype not in native.POOL_DTYPES
            or pool.v.dtype != pool.k.dtype
            or pool.k.shape != pool.v.shape
            or not (pool.k.is_contiguous() and pool.v.is_contiguous())
        ):
            return None
        frame = _frame(blocks, pool)
        if frame is None:
            return None
        weights, (H, Hkv, D, F, eps) = frame.weights, frame.dims
        if frame.width != d or pool.k.shape[2:] != (Hkv, D):
            return None
        pos, cos, sin = rotary.checked_tables()
        if (
            pos.shape != (1, T)
            or pos.dtype != torch.int64
            or not (pos.is_cpu and pos.is_contiguous())
            or cos.shape != sin.shape
            or cos.dim() != 2
            or cos.size(1) != D
            or D % 2
            or not (cos.is_contiguous() and sin.is_contiguous())
            or not native.plain(cos, sin)
        ):
            return None
        write, tables, lens, row_table = plan
        widths = {"h": d, "qkv": (H + 2 * Hkv) * D, "attn": H * D, "gate_up": 2 * F, "act": F}  # (tokens, width)
        scratch = torch.empty(T * sum(widths.values()), dtype=torch.float32)  # one allocation, cut by address
        at, buffers = scratch.data_ptr(), {}
        for name, width in widths.items():
            buffers[name] = at
            at += T * width * 4
        shape = {"tokens": T, "d": d, "H": H, "Hkv": Hkv, "D": D, "F": F, "eps": eps, "scale": D**-0.5}
        tensors = {"pos": pos, "cos": cos, "sin": sin, "write": write, "tables": tables, "lens": lens}
        step = native.LayerStep(
            **shape,
            **{name: t.data_ptr() for name, t in tensors.items()},
            row_table=row_table.data_ptr(),
            table_width=tables.size(1),
            block_size=pool.block_size,
            **buffers,
            threads=torch.get_num_threads(),
            kv_bf16=pool.k.dtype == torch.bfloat16,
        )
        return cls(
            weights,
            step,
            norm_w,
            norm.eps,
            [pos, cos, sin, write, tables, lens, row_table, pool.k, pool.v, scratch, frame],
        )

    def run(self, x: Tensor) -> Tensor:
        """Every layer over ``x`` (the embedding's output, (1, T, d), only read), then the final
        norm: a new tensor like ``x``."""
        return native.decoder_layers(self.weights, self.step, x, self.norm, self.eps)
