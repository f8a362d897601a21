"""Static batching, the seed's baseline: B requests at a time, left-padded, decoded until the
batch's *longest* request is done. Rows that finish early keep computing (wasted work), and the
next batch waits for the slowest row. ``prefill_padded`` is shared with the continuous engine's
slot-cache admissions."""

from __future__ import annotations

import time

import torch
from torch import Tensor

from tinyllm.engine.sequence import is_done
from tinyllm.generate import autocast, sample_next
from tinyllm.kv_cache import KVCache
from tinyllm.model import Transformer
from tinyllm.request import ContextTooLong, Request, Result, Sampling, check_fits, is_int
from tinyllm.stats import Stats


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
    """Static batching: B requests at a time, each batch decoded until its longest row is done."""
    if any(r.sampling is not None for r in requests):
        raise ValueError("run_static uses one sampling setting; per-request sampling needs ContinuousEngine")
    if not is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    Sampling(temperature, top_k, top_p)                 # validate once, with the usual messages
    model.eval()
    device = next(model.parameters()).device
    pick = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    stats = Stats(kv_bytes_per_token=kv_bytes_per_token(model, device))
    results: list[Result | None] = [None] * len(requests)
    t0 = time.perf_counter()
    for b0 in range(0, len(requests), batch_size):
        batch = requests[b0:b0 + batch_size]
        L = max(len(r.prompt) for r in batch)
        new_max = max(r.max_new_tokens for r in batch)
        try:
            check_fits(L, new_max, model.cfg.max_seq_len, "the model's max_seq_len")
        except ContextTooLong as e:
            raise ContextTooLong(f"batch at request {b0} (prompts left-padded to {L}): {e}") from None
        logits, cache, _ = prefill_padded(model, [r.prompt for r in batch], L + new_max)
        stats.prefill_tokens += L * len(batch)
        capacity = len(batch) * (L + new_max)
        stats.kv_reserved_tokens = max(stats.kv_reserved_tokens, capacity)
        outs: list[list[int]] = [[] for _ in batch]
        ttft = [0.0] * len(batch)
        done = [False] * len(batch)
        while True:
            nxt = sample_next(logits, **pick)
            toks = nxt.squeeze(-1).tolist()                      # GPU sync: tokens to the host
            now = time.perf_counter() - t0
            for j, (r, t) in enumerate(zip(batch, toks)):
                if done[j]:
                    continue
                outs[j].append(t)
                if len(outs[j]) == 1:
                    ttft[j] = now
                if is_done(r, outs[j]):
                    done[j] = True
                    results[b0 + j] = Result(outs[j], ttft[j], now)
            if all(done):
                break
            live = [j for j in range(len(batch)) if not done[j]]
            stats.decode_steps += 1
            stats.computed_rows += len(batch)
            stats.useful_rows += len(live)
            stats.kv_used_frac.append(sum(len(batch[j].prompt) + len(outs[j]) for j in live) / capacity)
            with autocast(device):
                logits, _ = model(nxt, cache=cache)
            logits = logits[:, -1]
    stats.wall_s = time.perf_counter() - t0
    stats.useful_tokens = sum(len(r.tokens) for r in results)
    return results, stats.summary(results)
