"""Static batching, the seed's baseline: B requests at a time, left-padded, decoded until the
batch's *longest* request is done. Rows that finish early keep computing (wasted work), and the
next batch waits for the slowest row. The loop itself is ``StaticBatcher`` (static_lane.py, one
step at a time); ``prefill_padded`` is shared with the continuous engine's slot-cache admissions."""

from __future__ import annotations

import time

import torch
from torch import Tensor

from tinyllm.generate import autocast
from tinyllm.kv_cache import KVCache
from tinyllm.model import Transformer
from tinyllm.request import Request, Result


def kv_bytes_per_token(model: Transformer, device: torch.device) -> int:
    elem = 2 if device.type == "cuda" else 4          # bf16 under autocast, else fp32
    return sum(layer.self_attn.cache_bytes_per_token(elem) for layer in model.layers)


@torch.no_grad()
def prefill_padded(model: Transformer, prompts: list[list[int]], max_len: int,
                   pad_id: int = 0) -> tuple[Tensor, KVCache, list[int]]:
    """Left-pad prompts to one length, run one prefill. Returns last-position logits (B, V),
    the filled cache (pos = padded length) and each row's pad count."""
    device = next(model.parameters()).device
    L = max(len(p) for p in prompts)
    pad = [L - len(p) for p in prompts]
    idx = torch.tensor([[pad_id] * n + list(p) for n, p in zip(pad, prompts)], device=device)
    cache = KVCache(model.cfg.n_layers, max_len, pad_lens=torch.tensor(pad, device=device))
    with autocast(device):
        logits, _ = model(idx, cache=cache)
    return logits[:, -1], cache, pad


@torch.no_grad()
def run_static(model: Transformer, requests: list[Request], batch_size: int,
               temperature: float = 0.0, top_k=None, top_p=None, generator=None,
               ) -> tuple[list[Result], dict]:
    """Static batching: B requests at a time, each batch decoded until its longest row is done.
    Runs ``StaticBatcher`` (static_lane.py) to the end: every request arrives at t=0."""
    from tinyllm.engine.static_lane import StaticBatcher     # it builds on prefill_padded above
    if any(r.sampling is not None for r in requests):
        raise ValueError("run_static uses one sampling setting; per-request sampling needs ContinuousEngine")
    eng = StaticBatcher(model, batch_size, temperature, top_k, top_p, generator)
    t0 = time.perf_counter()
    rids = [eng.add_request(r, arrival=0.0) for r in requests]
    while eng.has_work():
        eng.step()
    eng.stats.wall_s = time.perf_counter() - t0
    results = [eng.results[r] for r in rids]
    return results, eng.stats.summary(results)
