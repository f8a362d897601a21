"""From ContinuousEngine's arguments to its parts: the KV memory budget turned into a pool size and
a concurrency, the settings checked (each refusal says why), the cache the model runs on (and its
CUDA-graph decoder), and the scheduler that plans on it.

Memory, not slots (vLLM's ``gpu_memory_utilization`` / ``max_num_seqs``): what a user sets is a KV
budget in MiB. The slot cache (and static batching) reserve ``max_len`` tokens per row, so the
budget buys ``budget // (max_len x bytes per token)`` rows; the paged pool spends it on blocks that
follow real use, and runs as many sequences as those blocks allow, up to ``max_num_seqs``."""

from __future__ import annotations

import os

import torch

from tinyllm.engine.admission import AdmissionScheduler
from tinyllm.engine.scheduler import Scheduler, TokenBudgetScheduler
from tinyllm.kv.dense import SlotKVCache
from tinyllm.kv.paged import PagedKVCache
from tinyllm.model.config import ModelConfig, default_kv_blocks
from tinyllm.model.transformer import Transformer
from tinyllm.request import DEFAULT_MAX_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS, is_int

MIB = 2 ** 20


def rows_for_budget(kv_memory_mib: float, max_len: int, bytes_per_token: int) -> int:
    """Rows of ``max_len`` reserved tokens that fit the budget: the slot cache's slots, static
    batching's batch size. Refuses a budget too small for one row."""
    row_mib = max_len * bytes_per_token / MIB
    rows = int(kv_memory_mib * MIB // (max_len * bytes_per_token))
    if rows < 1:
        raise ValueError(f"kv_memory_mib {kv_memory_mib:g} MiB is too small for one request: a row reserves "
                         f"max_len {max_len} tokens x {bytes_per_token:,} bytes = {row_mib:.2f} MiB "
                         f"(raise the budget or lower max_len)")
    return rows


def free_memory_mib(device: torch.device) -> float | None:
    """Memory a KV cache could take on ``device`` now, in MiB: CUDA's free device memory, or the
    system's available memory (Linux's MemAvailable); None where it cannot be told."""
    if device.type == "cuda":
        try:
            return torch.cuda.mem_get_info(device)[0] / MIB
        except (RuntimeError, AssertionError):
            return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / MIB
    except (ValueError, OSError, AttributeError):
        return None


def check_kv_fits(mib: float, device: torch.device | str, what: str = "kv_memory_mib") -> None:
    """Refuse a KV cache of ``mib`` MiB (``what`` set it) that this device's free memory cannot
    hold, before anything is allocated: an allocation of that size would fail (a traceback from
    deep inside PyTorch) or push the machine into swap."""
    free = free_memory_mib(torch.device(device))
    if free is not None and mib > free:
        raise ValueError(f"{what}: a KV cache of {mib:,.0f} MiB is more than the {free:,.0f} MiB of memory free on "
                         f"{torch.device(device).type} (lower it)")


def check_budget_covers(budget: int | None, seqs: int) -> None:
    """The token-budget scheduler decodes every running sequence each step: its budget per step
    must cover the most sequences that can run."""
    if not is_int(budget) or budget < 1:
        raise ValueError(f"max_batched_tokens (the token budget per step) must be an integer >= 1, got {budget!r}")
    if budget < seqs:
        raise ValueError(f"the token budget per step (max_batched_tokens, {budget!r}) is less than the {seqs} "
                         f"sequences that may run (n_slots / max_num_seqs): every running request decodes one "
                         f"token per step, so the budget must cover them all")


def blocks_for_budget(kv_memory_mib: float, max_len: int, block_size: int, bytes_per_token: int) -> int:
    """Blocks of ``block_size`` tokens that fit the budget. Refuses a budget whose pool could not
    hold one request of ``max_len`` tokens (vLLM refuses a KV cache below max_model_len too)."""
    blocks = int(kv_memory_mib * MIB // (block_size * bytes_per_token))
    need = -(-max_len // block_size)
    if blocks < need:
        raise ValueError(f"kv_memory_mib {kv_memory_mib:g} MiB is too small for one request: its pool holds "
                         f"{blocks} block{'s' * (blocks != 1)} of {block_size} tokens, one request of max_len {max_len} needs {need} "
                         f"({need * block_size * bytes_per_token / MIB:.2f} MiB; raise the budget or lower max_len)")
    return blocks


def resolve_concurrency(n_slots: int | None, max_num_seqs: int | None, kv_memory_mib: float | None,
                        kv_blocks: int | None, kv: str, max_len: int, block_size: int, bytes_per_token: int,
                        max_batched_tokens: int | None = None) -> tuple[int, int | None]:
    """(slots, paged pool blocks or None for the default) from what the caller set. ``n_slots``
    is the older name of ``max_num_seqs`` (the cap on running sequences). With a KV budget the
    slot cache gets the rows it buys (at most the cap) and the paged pool the blocks it buys, run
    by up to ``max_num_seqs`` sequences (default DEFAULT_MAX_NUM_SEQS, at most the token budget:
    every running sequence decodes each step)."""
    for name, x in (("n_slots", n_slots), ("max_num_seqs", max_num_seqs)):
        if x is not None and (not is_int(x) or x < 1):
            raise ValueError(f"{name} must be an integer >= 1, got {x!r}")
    if n_slots is not None and max_num_seqs is not None and n_slots != max_num_seqs:
        raise ValueError(f"n_slots ({n_slots}) and max_num_seqs ({max_num_seqs}) name the same cap; give one")
    cap = n_slots if n_slots is not None else max_num_seqs
    if kv_memory_mib is None:
        if cap is None:
            raise ValueError("give kv_memory_mib (the KV memory budget) or n_slots / max_num_seqs")
        return cap, kv_blocks
    if isinstance(kv_memory_mib, bool) or not isinstance(kv_memory_mib, (int, float)) or not kv_memory_mib > 0:
        raise ValueError(f"kv_memory_mib must be a number of MiB > 0, got {kv_memory_mib!r}")
    if kv_blocks is not None:
        raise ValueError("give kv_memory_mib or kv_blocks, not both (the budget sizes the pool)")
    if cap is None:
        cap = DEFAULT_MAX_NUM_SEQS
        if max_batched_tokens is not None and is_int(max_batched_tokens) and max_batched_tokens >= 1:
            cap = min(cap, max_batched_tokens)
    if not is_int(max_len) or max_len < 1 or not is_int(block_size) or block_size < 1:
        return cap, None                  # check_settings / make_cache say what is wrong with them
    if kv == "paged":
        return cap, blocks_for_budget(kv_memory_mib, max_len, block_size, bytes_per_token)
    return min(cap, rows_for_budget(kv_memory_mib, max_len, bytes_per_token)), None


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
    if chunked_prefill:
        check_budget_covers(budget, n_slots)
    return max_len, prefix_cache, budget


def make_cache(model: Transformer, n_slots: int, max_len: int, kv: str, block_size: int, kv_blocks: int | None,
               cuda_graph, buckets: tuple[int, ...] | None,
               dtype: torch.dtype) -> tuple[SlotKVCache | PagedKVCache, object]:
    """The engine's cache (K/V in ``dtype``) and its CUDA-graph decoder (None without one); see
    ContinuousEngine."""
    cfg, device = model.cfg, next(model.parameters()).device
    decoder = None
    if cuda_graph is not False and not isinstance(cuda_graph, bool):   # a SlotGraphDecoder
        decoder, cache = cuda_graph, cuda_graph.slots
        if cache.n_slots != n_slots or cache.max_len != max_len or any(cache.active) or cache.k.dtype != dtype:
            raise ValueError(f"decoder cache has {cache.n_slots} slots of {cache.max_len} in {cache.k.dtype} "
                             f"(active: {sum(cache.active)}); need {n_slots} idle slots of {max_len} in {dtype}")
    else:
        token_bytes = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * dtype.itemsize      # K and V, every layer
        if kv == "slots":
            check_kv_fits(n_slots * max_len * token_bytes / MIB, device, "n_slots x max_len")
        else:
            if not is_int(block_size) or block_size < 1:
                raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
            n_blocks = default_kv_blocks(n_slots, max_len, block_size) if kv_blocks is None else kv_blocks
            if not is_int(n_blocks) or n_blocks < 1:
                raise ValueError(f"kv_blocks must be an integer >= 1, got {kv_blocks!r}")
            check_kv_fits((n_blocks + 1) * block_size * token_bytes / MIB, device, "kv_memory_mib / kv_blocks")
        try:
            if kv == "slots":
                cache = SlotKVCache(cfg.n_layers, n_slots, cfg.n_kv_heads, cfg.head_dim, max_len, dtype, device)
            else:
                cache = PagedKVCache(cfg.n_layers, n_slots, cfg.n_kv_heads, cfg.head_dim, n_blocks,
                                     block_size, max_len, dtype, device)
        except (RuntimeError, MemoryError) as e:          # (the free memory said yes, the allocator no)
            raise ValueError(f"the KV cache could not be allocated on {device.type}: "
                             f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}") from None
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
