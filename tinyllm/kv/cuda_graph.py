"""CUDA-graph decode for the slot cache: capture one decode step per attention-window bucket,
then replay it, so a small model's decode is not bound by kernel-launch overhead.

A step attends over a fixed window per bucket (the smallest bucket covering the longest active
context); the mask hides what lies beyond each slot's length, so the result equals the eager
step. Inputs (last tokens, slot lengths) live in static buffers that the graphs read on replay.
Prefill stays eager. CUDA only: elsewhere the constructor raises a clear error.

Status: written against the eager path's exact semantics but not yet run on a GPU (see the
issue note); the CPU tests only check the refusal.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from tinyllm.model.device import autocast
from tinyllm.kv.dense import SlotKVCache
from tinyllm.model.transformer import Transformer


def default_buckets(max_len: int) -> tuple[int, ...]:
    out, b = [], 64
    while b < max_len:
        out.append(b)
        b *= 2
    return tuple(out) + (max_len,)


class SlotGraphDecoder:
    def __init__(self, model: Transformer, slots: SlotKVCache, buckets: tuple[int, ...] | None = None):
        if not torch.cuda.is_available():
            raise ValueError("cuda_graph needs a CUDA device, and this machine has none; use cuda_graph=False")
        if not isinstance(slots, SlotKVCache):
            raise ValueError("cuda_graph supports kv='slots' only (paged: not yet)")
        if slots.device.type != "cuda" or next(model.parameters()).device.type != "cuda":
            raise ValueError("cuda_graph: the model and its slot cache must be on a CUDA device")
        self.model, self.slots = model, slots
        self.buckets = tuple(sorted(set(buckets or default_buckets(slots.max_len))))
        if self.buckets[-1] < slots.max_len:
            raise ValueError(f"buckets must cover max_len {slots.max_len}; largest is {self.buckets[-1]}")
        self._tok = torch.zeros(slots.n_slots, 1, dtype=torch.long, device=slots.device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self._pool = None
        free_before = torch.cuda.mem_get_info()[0]
        t = time.perf_counter()
        for b in self.buckets:
            self._capture(b)
        torch.cuda.synchronize()
        self.capture_s = time.perf_counter() - t
        self.graph_bytes = max(0, free_before - torch.cuda.mem_get_info()[0])

    @torch.no_grad()
    def _capture(self, bucket: int) -> None:
        s = self.slots
        s.window_override, s.defer_sync = bucket, True     # fixed shapes; no host→device copies inside
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):                    # warm-up outside the graph
                for _ in range(2):
                    with autocast(s.device):
                        self.model(self._tok, cache=s)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                with autocast(s.device):
                    logits, _ = self.model(self._tok, cache=s)
            self._pool = graph.pool()
            self._graphs[bucket] = (graph, logits)
        finally:
            s.window_override, s.defer_sync = None, False
            s._sync_lens()

    def bucket_for(self, window: int) -> int:
        return next(b for b in self.buckets if b >= window)

    @torch.no_grad()
    def step(self, last_tok: Tensor) -> Tensor:
        """One decode step for every slot (as ``model(last_tok, cache=slots)``): (S, 1, V) logits.
        The returned tensor is the graph's static output: use it before the next step."""
        s = self.slots
        graph, logits = self._graphs[self.bucket_for(s.longest_active() + 1)]
        self._tok.copy_(last_tok)
        s._sync_lens()
        graph.replay()
        s.end(1)                                            # host lengths advance as in eager
        return logits
