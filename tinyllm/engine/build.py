"""From ContinuousEngine's arguments to its parts: the settings checked (each refusal says why),
the cache the model runs on (and its CUDA-graph decoder), and the scheduler that plans on it."""

from __future__ import annotations

import torch

from tinyllm.engine.admission import AdmissionScheduler
from tinyllm.engine.scheduler import Scheduler, TokenBudgetScheduler
from tinyllm.kv.dense import SlotKVCache
from tinyllm.kv.paged import PagedKVCache
from tinyllm.model.config import ModelConfig, default_kv_blocks
from tinyllm.model.transformer import Transformer
from tinyllm.request import DEFAULT_MAX_BATCHED_TOKENS, is_int


def check_settings(cfg: ModelConfig, n_slots: int, max_len: int | None, kv: str, cuda_graph, chunked_prefill: bool,
                   max_batched_tokens: int | None, prefix_cache: bool | None) -> tuple[int, bool, int]:
    """Refuse bad engine settings with a clear message; returns (max_len, prefix_cache, token
    budget) with their defaults filled in."""
    if not is_int(n_slots) or n_slots < 1:
        raise ValueError(f"n_slots must be an integer >= 1, got {n_slots!r}")
    max_len = cfg.max_seq_len if max_len is None else max_len
    if not is_int(max_len) or not 2 <= max_len <= cfg.max_seq_len:
        raise ValueError(f"max_len must be an integer in [2, {cfg.max_seq_len}] "
                         f"(the model's max_seq_len), got {max_len!r}")
    if kv not in ("slots", "paged"):
        raise ValueError(f"kv must be 'slots' or 'paged', got {kv!r}")
    if cuda_graph is not False and kv != "slots":
        raise ValueError("cuda_graph supports kv='slots' only (paged: not yet)")
    if not isinstance(chunked_prefill, bool):
        raise ValueError(f"chunked_prefill must be True or False, got {chunked_prefill!r}")
    if chunked_prefill and kv != "paged":
        raise ValueError("chunked_prefill needs kv='paged' (the token-budget scheduler allocates blocks)")
    prefix_cache = chunked_prefill if prefix_cache is None else prefix_cache
    if not isinstance(prefix_cache, bool):
        raise ValueError(f"prefix_cache must be True, False or None (on with chunked prefill), got {prefix_cache!r}")
    if prefix_cache and not chunked_prefill:
        raise ValueError("prefix_cache needs chunked_prefill=True (the token-budget scheduler looks prefixes up)")
    budget = DEFAULT_MAX_BATCHED_TOKENS if max_batched_tokens is None else max_batched_tokens
    if chunked_prefill and (not is_int(budget) or budget < n_slots):
        raise ValueError(f"max_batched_tokens must be an integer >= n_slots ({n_slots}: every running "
                         f"request decodes each step), got {max_batched_tokens!r}")
    return max_len, prefix_cache, budget


def make_cache(model: Transformer, n_slots: int, max_len: int, kv: str, block_size: int, kv_blocks: int | None,
               cuda_graph, buckets: tuple[int, ...] | None) -> tuple[SlotKVCache | PagedKVCache, object]:
    """The engine's cache and its CUDA-graph decoder (None without one); see ContinuousEngine."""
    cfg, device = model.cfg, next(model.parameters()).device
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    decoder = None
    if cuda_graph is not False and not isinstance(cuda_graph, bool):   # a SlotGraphDecoder
        decoder, cache = cuda_graph, cuda_graph.slots
        if cache.n_slots != n_slots or cache.max_len != max_len or any(cache.active):
            raise ValueError(f"decoder cache has {cache.n_slots} slots of {cache.max_len} "
                             f"(active: {sum(cache.active)}); need {n_slots} idle slots of {max_len}")
    elif kv == "slots":
        cache = SlotKVCache(cfg.n_layers, n_slots, cfg.n_kv_heads, cfg.head_dim, max_len, dtype, device)
    else:
        if not is_int(block_size) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        n_blocks = default_kv_blocks(n_slots, max_len, block_size) if kv_blocks is None else kv_blocks
        if not is_int(n_blocks) or n_blocks < 1:
            raise ValueError(f"kv_blocks must be an integer >= 1, got {kv_blocks!r}")
        cache = PagedKVCache(cfg.n_layers, n_slots, cfg.n_kv_heads, cfg.head_dim, n_blocks,
                             block_size, max_len, dtype, device)
    if cuda_graph is True:
        from tinyllm.kv.cuda_graph import SlotGraphDecoder
        decoder = SlotGraphDecoder(model, cache, buckets=buckets)
    return cache, decoder


def make_scheduler(cache: SlotKVCache | PagedKVCache, chunked_prefill: bool, prefix_cache: bool,
                   max_batched_tokens: int) -> Scheduler:
    """The token-budget scheduler (with the pool's prefix cache on or off), or the seed's."""
    if not chunked_prefill:
        return AdmissionScheduler(cache)
    cache.prefix_cache = prefix_cache
    return TokenBudgetScheduler(cache, max_batched_tokens)
