"""CUDA-graph decode for the slot cache: capture one decode step per attention-window bucket,
then replay it, so a small model's decode is not bound by kernel-launch overhead.

A step attends over a fixed window per bucket (the smallest bucket covering the longest active
context); the mask hides what lies beyond each slot's length. Inputs (last tokens, slot lengths)
live in static buffers that the graphs read on replay. Prefill stays eager. CUDA only: elsewhere
the constructor raises a clear error.

What equals what: eager attends a window of longest + 1, the graph a whole bucket, so the two
run attention at different shapes. In float32 (``model.device.full_precision``) that changes
only summation order: greedy tokens are the same. Under bf16 autocast (the CUDA default) the
shapes round differently, so logits agree to bf16 noise (tests/test_cuda_graph.py bounds it) and
a near-tie may pick another token.

Status: not yet run on a GPU (scripts/gpu-check runs its tests); the CPU tests check the
refusals, the bucket rules, the full-slot error and that capture leaves the host state alone.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from tinyllm.kv.dense import SlotKVCache
from tinyllm.model.device import autocast
from tinyllm.model.transformer import Transformer
from tinyllm.request import is_int


def default_buckets(max_len: int) -> tuple[int, ...]:
    out, b = [], 64
    while b < max_len:
        out.append(b)
        b *= 2
    return tuple(out) + (max_len,)


def check_buckets(buckets, max_len: int) -> tuple[int, ...]:
    """The attention windows to capture, sorted (None: ``default_buckets``). Each is an integer in
    [1, max_len] and the largest is max_len, so every context up to max_len has a bucket: a bucket
    above max_len would fail at capture on a shape mismatch, and 0 would fall through the cache's
    ``window_override or ...`` to a host-derived window, baked into the graph."""
    if buckets is None:
        return default_buckets(max_len)
    buckets = tuple(buckets)
    if not buckets:
        raise ValueError(f"buckets must not be empty (None: the default, {default_buckets(max_len)})")
    for b in buckets:
        if not is_int(b) or not 1 <= b <= max_len:
            raise ValueError(f"buckets must be integers in [1, {max_len}] (max_len), got {b!r}")
    out = tuple(sorted(set(buckets)))
    if out[-1] != max_len:
        raise ValueError(f"buckets must cover max_len {max_len}; largest is {out[-1]}")
    return out


def full_slot_error(slots: SlotKVCache) -> ValueError | None:
    """The eager path's error for a slot with no room for another token (``SlotKVCache.begin``),
    or None: replay must refuse a full slot as eager does, not write past its end."""
    longest = slots.longest_active()
    if longest >= slots.max_len:
        return ValueError(f"SlotKVCache: a slot is full ({longest} of max_len {slots.max_len})")
    return None


@contextmanager
def capturing(slots: SlotKVCache, bucket: int) -> Iterator[None]:
    """The cache set up for capturing ``bucket``: a fixed window and no host→device copies, and
    its host state as it was afterwards. ``Transformer.forward`` calls ``cache.end``, so the
    warm-up and capture passes would otherwise advance every active slot's length three times."""
    lens, active = list(slots.lens), list(slots.active)
    slots.window_override, slots.defer_sync = bucket, True
    try:
        yield
    finally:
        slots.window_override, slots.defer_sync = None, False
        slots.lens[:], slots.active[:] = lens, active
        slots._sync_lens()


class SlotGraphDecoder:
    """The decode step of ``model`` over ``slots``, captured once per bucket and replayed by
    ``step``. Everything is checked before any capture (a bad bucket or an active slot would
    otherwise fail inside it, or capture a wrong window), and every CUDA call names the model's
    device (the current device may be another)."""

    def __init__(self, model: Transformer, slots: SlotKVCache, buckets: tuple[int, ...] | None = None):
        if not isinstance(slots, SlotKVCache):
            raise ValueError("cuda_graph supports kv='slots' only (paged: not yet)")
        self.buckets = check_buckets(buckets, slots.max_len)
        if any(slots.active):
            raise ValueError(
                f"cuda_graph: capture needs every slot idle; {sum(slots.active)} of {slots.n_slots} are active"
            )
        if not torch.cuda.is_available():
            raise ValueError("cuda_graph needs a CUDA device, and this machine has none; use cuda_graph=False")
        device = next(model.parameters()).device
        if device.type != "cuda" or slots.k.device != device:
            raise ValueError(
                f"cuda_graph: the model and its slot cache must be on one CUDA device "
                f"(model: {device}, cache: {slots.k.device})"
            )
        self.model, self.slots, self.device = model, slots, device
        self._tok = torch.zeros(slots.n_slots, 1, dtype=torch.long, device=device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self._pool = None
        with torch.cuda.device(device):  # streams, capture and memory: the model's device, not the current one
            free_before = torch.cuda.mem_get_info(device)[0]
            t = time.perf_counter()
            for b in self.buckets:
                self._capture(b)
            torch.cuda.synchronize(device)
            self.capture_s = time.perf_counter() - t
            self.graph_bytes = max(0, free_before - torch.cuda.mem_get_info(device)[0])

    @torch.no_grad()
    def _capture(self, bucket: int) -> None:
        s = self.slots
        with capturing(s, bucket):
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # warm-up outside the graph
                for _ in range(2):
                    with autocast(self.device):
                        self.model(self._tok, cache=s)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool), autocast(self.device):
                logits, _ = self.model(self._tok, cache=s)
            self._pool = graph.pool()
            self._graphs[bucket] = (graph, logits)

    def bucket_for(self, window: int) -> int:
        """The smallest bucket covering ``window`` attention positions."""
        for b in self.buckets:
            if b >= window:
                return b
        raise ValueError(f"no bucket covers an attention window of {window} (largest: {self.buckets[-1]})")

    @torch.no_grad()
    def step(self, last_tok: Tensor) -> Tensor:
        """One decode step for every slot (as ``model(last_tok, cache=slots)``): (S, 1, V) logits.
        The returned tensor is the graph's static output: use it before the next step."""
        s = self.slots
        if (err := full_slot_error(s)) is not None:
            raise err
        graph, logits = self._graphs[self.bucket_for(s.longest_active() + 1)]
        with torch.cuda.device(self.device):
            self._tok.copy_(last_tok)
            s._sync_lens()
            graph.replay()
        s.end(1)  # host lengths advance as in eager
        return logits
