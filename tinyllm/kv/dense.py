"""Dense KV caches: one left-padded batch (``KVCache``) and a fixed set of slots (``SlotKVCache``).

Both implement the model's ``AttentionCache`` protocol: they hand out RoPE positions, store the
new K/V and build the attention mask, so the model never knows which cache it runs on.
``SlotKVCache`` also implements the slot interface the engine schedules with (free_slots, admit,
release, reserve_step, ...), shared with ``paged.PagedKVCache``. The engine runs on it only with
CUDA graphs (``kv/cuda_graph.py``: a graph replays fixed dense shapes); otherwise its slots are a
``PagedKVCache`` reserving max_len per slot, on the forward every scheduler runs (``engine/forward.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tinyllm.model.transformer import grouped_attention


class KVCache:
    """K/V for one batch of left-padded rows, positions 0..max_len-1 in cache order.

    Row b's first ``pad_lens[b]`` positions are padding: they are masked out as keys, and the
    row's RoPE positions start at 0 at its first real token, so a padded row computes exactly
    what it would alone. (A pad query attends to itself only, to keep its softmax finite.)

    ``dtype``: what the K/V is kept in (None: as the model computes it). A prefill for a bfloat16
    slot cache or pool keeps its K/V in bfloat16 too, so its prompt tokens attend the same rounded
    K/V as a prompt run through the pool in chunks would."""

    def __init__(self, n_layers: int, max_len: int, pad_lens: Tensor | None = None, dtype: torch.dtype | None = None):
        self.max_len = max_len
        self.pad_lens = pad_lens
        self.dtype = dtype
        self.pos = 0  # positions filled so far (padding included)
        self.k: list[Tensor | None] = [None] * n_layers
        self.v: list[Tensor | None] = [None] * n_layers
        self._mask: Tensor | None = None

    def begin(self, batch: int, n_new: int) -> Tensor:
        if self.pos + n_new > self.max_len:
            raise ValueError(f"KVCache: {self.pos} + {n_new} tokens exceed its max_len {self.max_len}")
        device = self.pad_lens.device if self.pad_lens is not None else None
        pad = self.pad_lens if self.pad_lens is not None else torch.zeros(batch, dtype=torch.long, device=device)
        q_pos = torch.arange(self.pos, self.pos + n_new, device=pad.device)  # cache positions
        k_pos = torch.arange(self.pos + n_new, device=pad.device)
        causal = k_pos[None, None, :] <= q_pos[None, :, None]
        real = k_pos[None, None, :] >= pad[:, None, None]
        self_only = k_pos[None, None, :] == q_pos[None, :, None]
        self._mask = ((causal & real) | self_only).unsqueeze(1)  # (B, 1, T, S)
        return (q_pos[None, :] - pad[:, None]).clamp(min=0)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.k[layer] is None:
            B, H, _, D = k.shape
            self.k[layer] = k.new_zeros(B, H, self.max_len, D, dtype=self.dtype or k.dtype)
            self.v[layer] = v.new_zeros(B, H, self.max_len, D, dtype=self.dtype or v.dtype)
        end = self.pos + k.size(2)
        self.k[layer][:, :, self.pos : end] = k  # (rounded to the cache's dtype)
        self.v[layer][:, :, self.pos : end] = v
        keys, vals = self.k[layer][:, :, :end], self.v[layer][:, :, :end]
        return grouped_attention(q, keys.to(q.dtype), vals.to(q.dtype), self._mask)

    def end(self, n_new: int) -> None:
        self.pos += n_new
        self._mask = None

    def real_kv(self, layer: int, row: int, pad: int) -> tuple[Tensor, Tensor]:
        """Row ``row``'s K/V without its padding: (Hkv, n_real, D) each."""
        return self.k[layer][row, :, pad : self.pos], self.v[layer][row, :, pad : self.pos]


class SlotKVCache:
    """``n_slots`` rows of ``max_len`` positions each, reserved up front (no padding inside).

    A slot holds one request's context from position 0. Decode runs all slots at once (one new
    token per slot); attention covers only the window up to the longest active context, so the
    cost follows real lengths, not max_len. Idle slots compute a throwaway row."""

    def __init__(
        self,
        n_layers: int,
        n_slots: int,
        n_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ):
        self.n_layers, self.n_slots, self.max_len = n_layers, n_slots, max_len
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        shape = (n_layers, n_slots, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=dtype, device=self.device)
        self.lens = [0] * n_slots  # context tokens stored per slot
        self.active = [False] * n_slots
        self._rows = torch.arange(n_slots, device=self.device)
        self._lens_t = torch.zeros(n_slots, dtype=torch.long, device=self.device)  # updated in place
        self._mask: Tensor | None = None
        self._window = 0
        self.window_override: int | None = None  # CUDA graphs: a fixed attention window per bucket
        self.defer_sync = False  # CUDA graphs: lengths are synced outside capture

    # -- slot interface (the engine schedules with these) ---------------------------------
    def free_slots(self) -> list[int]:
        return [s for s in range(self.n_slots) if not self.active[s]]

    def check_fits(self, total_tokens: int) -> None:
        """A slot holds max_len tokens, which the engine already checks: nothing more to refuse."""

    def can_admit(self, context_lens: list[int]) -> bool:
        """Memory is reserved per slot, so any free slot can take any context up to max_len."""
        return all(n <= self.max_len for n in context_lens)

    def admit(self, slots: list[int], pre: KVCache, pad: list[int]) -> None:
        """Move each prefilled row's real tokens into its slot (positions from 0)."""
        for row, (s, p) in enumerate(zip(slots, pad)):
            n = pre.pos - p
            for layer in range(self.n_layers):
                k, v = pre.real_kv(layer, row, p)
                self.k[layer, s, :, :n] = k
                self.v[layer, s, :, :n] = v
            self.lens[s] = n
            self.active[s] = True
        self._sync_lens()

    def release(self, slot: int) -> None:
        self.active[slot] = False
        self.lens[slot] = 0
        self._sync_lens()

    def reserve_step(self, victim=None) -> list[int]:
        """Room for one more token per active slot. Slots never run out: nothing to preempt."""
        return []

    def used_tokens(self) -> int:
        return sum(n for n, a in zip(self.lens, self.active) if a)

    def reserved_tokens(self) -> int:
        return self.n_slots * self.max_len

    def allocated_tokens(self) -> int:
        """Memory claimed by requests: a whole slot each."""
        return sum(self.active) * self.max_len

    def context_lens(self) -> list[int]:
        return list(self.lens)

    # -- AttentionCache protocol (decode: one token per slot) -----------------------------
    def begin(self, batch: int, n_new: int) -> Tensor:
        if batch != self.n_slots or n_new != 1:
            raise ValueError(
                f"SlotKVCache decodes one token for each of its {self.n_slots} slots, "
                f"got batch {batch} x {n_new} tokens"
            )
        longest = max((n for n, a in zip(self.lens, self.active) if a), default=0)
        if longest >= self.max_len:
            raise ValueError(f"SlotKVCache: a slot is full ({longest} of max_len {self.max_len})")
        self._window = self.window_override or longest + 1
        k_pos = torch.arange(self._window, device=self.device)
        self._mask = (k_pos[None, :] <= self._lens_t[:, None])[:, None, None, :]  # (S, 1, 1, W)
        return self._lens_t[:, None]

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        kl, vl = self.k[layer], self.v[layer]
        kl[self._rows, :, self._lens_t] = k[:, :, 0].to(kl.dtype)
        vl[self._rows, :, self._lens_t] = v[:, :, 0].to(vl.dtype)
        W = self._window
        return grouped_attention(q, kl[:, :, :W].to(q.dtype), vl[:, :, :W].to(q.dtype), self._mask)

    def end(self, n_new: int) -> None:
        for s in range(self.n_slots):
            if self.active[s]:
                self.lens[s] += 1
        self._sync_lens()
        self._mask = None

    def longest_active(self) -> int:
        return max((n for n, a in zip(self.lens, self.active) if a), default=0)

    def _sync_lens(self) -> None:
        """Host lengths → the device tensor, in place (a CUDA graph keeps reading the same memory)."""
        if not self.defer_sync:
            self._lens_t.copy_(torch.tensor(self.lens, dtype=torch.long), non_blocking=True)
