"""A Llama-architecture decoder: RMSNorm, rotary positions, grouped-query attention, SwiGLU.

Parameter names follow Hugging Face's LlamaForCausalLM (minus its ``model.`` prefix), so a
checkpoint loads by renaming keys, nothing else. In memory, q/k/v and gate/up are each one fused
matrix (``qkv_proj``, ``gate_up_proj``: one matmul instead of three, or two); ``state_dict()``
and ``load_state_dict()`` split and fuse them, so checkpoints stay unfused, in HF's names. The KV cache owns positions, storage and the
attention mask (see ``AttentionCache``); the model only computes, which is why one model serves a
padded batch, a slot cache and a paged cache alike.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinyllm import native
from tinyllm.model.c_layers import CLayers, register_block_kinds
from tinyllm.model.config import ModelConfig
from tinyllm.model.linear import Linear


class AttentionCache(Protocol):
    """What attention needs from a KV cache. ``begin`` is called once per forward with the batch
    size and the number of new tokens per row and returns their RoPE positions (B, T); ``attend`` stores one layer's
    new K/V and returns attention over everything the row may see; ``end`` commits the tokens."""

    def begin(self, batch: int, n_new: int) -> Tensor: ...
    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor: ...
    def end(self, n_new: int) -> None: ...


def grouped_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Scaled dot-product attention with fewer K/V heads than query heads, without copying K/V.

    q: (B, H, T, D); k, v: (B, Hkv, S, D); mask: bool (B, 1, T, S), True = may attend.
    The G = H / Hkv query heads that share a K/V head are folded into the query axis."""
    B, H, T, D = q.shape
    Hkv = k.size(1)
    g = H // Hkv
    if g > 1:
        q = q.reshape(B, Hkv, g * T, D)
        if T > 1:  # one query per row (decode): the mask broadcasts
            mask = mask.repeat(1, 1, g, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.reshape(B, H, T, D)


class NoCache:
    """Plain causal attention from position 0, nothing stored: training and scoring."""

    def __init__(self, device: torch.device):
        self.device = device

    def begin(self, batch: int, n_new: int) -> Tensor:
        return torch.arange(n_new, device=self.device).expand(batch, n_new)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        g = q.size(1) // k.size(1)
        if g > 1:
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def end(self, n_new: int) -> None:
        pass


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """x / rms(x), in float32 (as HF's LlamaRMSNorm), then scaled. On CPU in float32 without
        autograd, one C pass per row (tinyllm/native/ops.py; PyTorch runs it as six small ops)."""
        y = native.rms_norm(x, self.weight, self.eps)
        if y is not None:
            return y
        return self.weight * F.rms_norm(x.float(), (x.size(-1),), eps=self.eps).to(x.dtype)


def rope_tables(head_dim: int, max_len: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos/sin (max_len, head_dim) in HF's half-split layout (rotate_half, not interleaved)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: (B, H, T, D); cos/sin: (B, 1, T, D)."""
    half = x.size(-1) // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class Rotary:
    """One forward's rotary positions: (B, T) rows of the model's cos/sin tables, applied to the q
    and k heads of each layer. On CPU in float32 without autograd, in place in one C pass
    (``native.rope_``); otherwise by PyTorch, from the tables' rows gathered once per forward."""

    def __init__(self, pos: Tensor, cos: Tensor, sin: Tensor):
        self.pos, self.cos, self.sin = pos, cos, sin
        self._gathered: tuple[Tensor, Tensor] | None = None
        self._checked = False  # positions range-checked (by the first layer)

    def checked_tables(self) -> tuple[Tensor, Tensor, Tensor]:
        """(positions, cos, sin) with the positions range-checked against the tables, for a C
        caller that reads them raw (``model/c_layers.py``)."""
        if not self._checked and self.pos.numel():
            native.check_range(self.pos, self.cos.size(0), "rotary positions", " (max_seq_len)")
        self._checked = True
        return self.pos, self.cos, self.sin

    def rotate(self, heads: Tensor, n_rotated: int) -> tuple[Tensor, Tensor]:
        """heads: (B, T, heads, D), the fused projection's output by head; its first ``n_rotated``
        heads rotated, returned as (B, n_rotated, T, D), and the rest (B, heads - n_rotated, T, D)."""
        if native.rope_(heads, self.pos, self.cos, self.sin, n_rotated, bounds_checked=self._checked):
            self._checked = True
            by_head = heads.transpose(1, 2)
            return by_head[:, :n_rotated], by_head[:, n_rotated:]
        if self._gathered is None:
            self._gathered = self.cos[self.pos].unsqueeze(1), self.sin[self.pos].unsqueeze(1)
        by_head = heads.transpose(1, 2)
        return apply_rope(by_head[:, :n_rotated], *self._gathered), by_head[:, n_rotated:]


class FusedLinear(Linear):
    """Several bias-free projections of the same input as one matrix (rows stacked in ``parts``
    order): one matmul. Its module saves and loads the parts under their own names
    (``fused_state_dict``), and initialises them one by one, as separate layers would be."""

    def __init__(self, d_in: int, parts: dict[str, int]):
        super().__init__(d_in, sum(parts.values()), bias=False)
        self.parts = parts  # HF name -> output rows


def _split_on_save(module: nn.Module, state: dict, prefix: str, _meta) -> None:
    """state_dict hook: each FusedLinear child's weight as its parts, under their HF names (copies:
    safetensors refuses tensors that share memory)."""
    for name, child in module.named_children():
        if isinstance(child, FusedLinear):
            w = state.pop(f"{prefix}{name}.weight")
            for part, piece in zip(child.parts, w.split(list(child.parts.values()))):
                state[f"{prefix}{part}.weight"] = piece.clone()


def _fuse_on_load(module: nn.Module, state: dict, prefix: str, *_args) -> None:
    """load_state_dict pre-hook: the parts (HF names) stacked into the FusedLinear's weight."""
    for name, child in module.named_children():
        if isinstance(child, FusedLinear):
            keys = [f"{prefix}{part}.weight" for part in child.parts]
            if all(k in state for k in keys):
                state[f"{prefix}{name}.weight"] = torch.cat([state.pop(k) for k in keys])


def fused_state_dict(module: nn.Module) -> None:
    """Make ``module`` save and load its FusedLinear children as their unfused parts."""
    module.register_state_dict_post_hook(_split_on_save)
    module.register_load_state_dict_pre_hook(_fuse_on_load)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        d, hd = cfg.d_model, cfg.head_dim
        self.sizes = (cfg.n_heads * hd, cfg.n_kv_heads * hd, cfg.n_kv_heads * hd)
        self.qkv_proj = FusedLinear(d, dict(zip(("q_proj", "k_proj", "v_proj"), self.sizes)))
        self.o_proj = Linear(cfg.n_heads * hd, d, bias=False)
        fused_state_dict(self)

    def cache_bytes_per_token(self, elem_bytes: int) -> int:
        """K and V for one token in this layer."""
        return 2 * self.n_kv_heads * self.head_dim * elem_bytes

    def forward(self, x: Tensor, rotary: Rotary, cache: AttentionCache, residual: Tensor) -> Tensor:
        """residual + attention(x): the output projection adds the residual as it writes (C path)."""
        B, T, _ = x.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        heads = self.qkv_proj(x).view(B, T, H + 2 * Hkv, D)
        qk, v = rotary.rotate(heads, H + Hkv)  # q and k heads: one RoPE
        q, k = qk.split((H, Hkv), dim=1)
        out = cache.attend(self.layer_idx, q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1), add=residual)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up_proj = FusedLinear(cfg.d_model, {"gate_proj": cfg.d_ff, "up_proj": cfg.d_ff})
        self.down_proj = Linear(cfg.d_ff, cfg.d_model, bias=False)
        fused_state_dict(self)

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        """residual + mlp(x), the residual added by the down projection as it writes."""
        gate_up = self.gate_up_proj(x)
        h = native.silu_mul(gate_up)  # one C pass where it can
        if h is None:
            gate, up = gate_up.chunk(2, dim=-1)
            h = F.silu(gate) * up
        return self.down_proj(h, add=residual)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, rotary: Rotary, cache: AttentionCache) -> Tensor:
        x = self.self_attn(self.input_layernorm(x), rotary, cache, residual=x)
        return self.mlp(self.post_attention_layernorm(x), residual=x)


# The C path runs a block only if it is exactly this layout (c_layers checks each module's class).
register_block_kinds((Block, Attention, MLP, FusedLinear, Linear, FusedLinear, Linear, RMSNorm, RMSNorm))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, init_weights: bool = True):
        """``init_weights=False`` skips the random init (a checkpoint is about to replace it)."""
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.reset_rope()
        if init_weights:
            self.apply(self._init_weights)

    def reset_rope(self) -> None:
        """(Re)build the rotary tables; they are derived, never loaded (and must be real after a
        model built on the meta device receives its weights)."""
        device = self.embed_tokens.weight.device
        cos, sin = rope_tables(self.cfg.head_dim, self.cfg.max_seq_len, self.cfg.rope_theta)
        if device.type == "meta":
            cos, sin = cos.to("meta"), sin.to("meta")
        self.register_buffer("rope_cos", cos.to(device), persistent=False)
        self.register_buffer("rope_sin", sin.to(device), persistent=False)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, FusedLinear):  # part by part: the values separate layers get
            for piece in m.weight.data.split(list(m.parts.values())):
                nn.init.normal_(piece, mean=0.0, std=0.02)
        elif isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        idx: Tensor,
        cache: AttentionCache | None = None,
        targets: Tensor | None = None,
        logits_at: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """idx (B, T) → (logits (B, T, V), loss or None). Without a cache: plain causal attention
        over idx from position 0 (training, scoring). ``logits_at`` (positions along T): only
        those positions get logits, (B, len(logits_at), V): a mixed batch samples a few tokens
        of many, and the vocabulary projection is the largest matmul of a small model."""
        T = idx.size(1)
        if cache is None:
            if T > self.cfg.max_seq_len:
                raise ValueError(f"sequence of {T} tokens is longer than max_seq_len {self.cfg.max_seq_len}")
            cache = NoCache(idx.device)
        rotary = Rotary(cache.begin(idx.size(0), T), self.rope_cos, self.rope_sin)
        x = self.embed_tokens(idx)
        c_layers = CLayers.plan(self.layers, self.norm, x, rotary, cache)  # one C call, where it can
        if c_layers:
            x = c_layers.run(x)  # the blocks, then the norm
        else:
            for layer in self.layers:
                x = layer(x, rotary, cache)
            x = self.norm(x)  # (row by row: before or after the pick alike)
        cache.end(T)
        if logits_at is not None:
            x = x[:, logits_at]
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss
