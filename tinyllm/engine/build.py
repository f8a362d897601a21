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

from tinyllm.config import EngineConfig
from tinyllm.engine.admission import AdmissionScheduler
from tinyllm.engine.scheduler import Scheduler, TokenBudgetScheduler
from tinyllm.engine.speculate import NgramProposer, Proposer
from tinyllm.kv.dense import SlotKVCache
from tinyllm.kv.paged import PagedKVCache
from tinyllm.model.config import ModelConfig, default_kv_blocks, resolve_draft_model
from tinyllm.model.transformer import Transformer
from tinyllm.request import is_int

MIB = 2**20


def rows_for_budget(kv_memory_mib: float, max_len: int, bytes_per_token: int) -> int:
    """Rows of ``max_len`` reserved tokens that fit the budget: the slot cache's slots, static
    batching's batch size. Refuses a budget too small for one row."""
    row_mib = max_len * bytes_per_token / MIB
    rows = int(kv_memory_mib * MIB // (max_len * bytes_per_token))
    if rows < 1:
        raise ValueError(
            f"kv_memory_mib {kv_memory_mib:g} MiB is too small for one request: a row reserves "
            f"max_len {max_len} tokens x {bytes_per_token:,} bytes = {row_mib:.2f} MiB "
            f"(raise the budget or lower max_len)"
        )
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
        raise ValueError(
            f"{what}: a KV cache of {mib:,.0f} MiB is more than the {free:,.0f} MiB of memory free on "
            f"{torch.device(device).type} (lower it)"
        )


def check_budget_covers(budget: int | None, seqs: int) -> None:
    """The token-budget scheduler decodes every running sequence each step: its budget per step
    must cover the most sequences that can run."""
    if not is_int(budget) or budget < 1:
        raise ValueError(f"max_batched_tokens (the token budget per step) must be an integer >= 1, got {budget!r}")
    if budget < seqs:
        raise ValueError(
            f"the token budget per step (max_batched_tokens, {budget!r}) is less than the {seqs} "
            f"sequences that may run (n_slots / max_num_seqs): every running request decodes one "
            f"token per step, so the budget must cover them all"
        )


def blocks_for_budget(kv_memory_mib: float, max_len: int, block_size: int, bytes_per_token: int) -> int:
    """Blocks of ``block_size`` tokens that fit the budget. Refuses a budget whose pool could not
    hold one request of ``max_len`` tokens (vLLM refuses a KV cache below max_model_len too)."""
    blocks = int(kv_memory_mib * MIB // (block_size * bytes_per_token))
    need = -(-max_len // block_size)
    if blocks < need:
        raise ValueError(
            f"kv_memory_mib {kv_memory_mib:g} MiB is too small for one request: its pool holds "
            f"{blocks} block{'s' * (blocks != 1)} of {block_size} tokens, one request of max_len {max_len} needs {need} "
            f"({need * block_size * bytes_per_token / MIB:.2f} MiB; raise the budget or lower max_len)"
        )
    return blocks


def engine_config(
    config: EngineConfig | None, n_slots: int | None, max_len: int | None, settings: dict
) -> tuple[EngineConfig, object]:
    """The EngineConfig that ContinuousEngine's arguments describe, and the CUDA-graph decoder
    passed as ``cuda_graph`` (None if none was). The seed's keywords build a config;
    ``n_slots`` is the seed's name of ``max_num_seqs``; keywords replace a given config's."""
    unknown = sorted(set(settings) - set(EngineConfig.settings()))
    if unknown:
        raise TypeError(
            f"ContinuousEngine got unknown setting(s) {', '.join(unknown)}; "
            f"the settings are EngineConfig's: {', '.join(EngineConfig.settings())}"
        )
    if n_slots is not None and (not is_int(n_slots) or n_slots < 1):
        raise ValueError(f"n_slots must be an integer >= 1, got {n_slots!r}")
    cap = settings.get("max_num_seqs")
    if n_slots is not None and cap is not None and n_slots != cap:
        raise ValueError(f"n_slots ({n_slots}) and max_num_seqs ({cap}) name the same cap; give one")
    if n_slots is not None:
        settings["max_num_seqs"] = n_slots
    if max_len is not None:
        settings["max_len"] = max_len
    decoder = settings.get("cuda_graph")
    if decoder is not None and not isinstance(decoder, bool):  # a SlotGraphDecoder to reuse
        settings["cuda_graph"] = True
    else:
        decoder = None
    if config is None:
        if settings.get("max_num_seqs") is None and settings.get("kv_memory_mib") is None:
            raise ValueError(
                "give kv_memory_mib (the KV memory budget) or n_slots / max_num_seqs "
                "(or config=EngineConfig(...), whose defaults need neither)"
            )
        return EngineConfig(**settings), decoder
    if not isinstance(config, EngineConfig):
        raise ValueError(f"config must be an EngineConfig, got {type(config).__name__}")
    return (config.replace(**settings) if settings else config), decoder


def check_max_len(cfg: ModelConfig, max_len: int | None) -> int:
    """``max_len`` against the model's context (None: the whole context)."""
    max_len = cfg.max_seq_len if max_len is None else max_len
    if not is_int(max_len) or not 2 <= max_len <= cfg.max_seq_len:
        raise ValueError(
            f"max_len must be an integer in [2, {cfg.max_seq_len}] (the model's max_seq_len), got {max_len!r}"
        )
    return max_len


def resolve_concurrency(config: EngineConfig, max_len: int, bytes_per_token: int) -> tuple[int, int | None]:
    """(slots, paged pool blocks or None for the default). With a KV budget the slot cache gets
    the rows it buys (at most the cap) and the paged pool the blocks it buys, run by up to
    ``config.seqs_cap`` sequences."""
    cap = config.seqs_cap
    if config.kv_memory_mib is None:
        return cap, config.kv_blocks
    if config.kv == "paged":
        return cap, blocks_for_budget(config.kv_memory_mib, max_len, config.block_size, bytes_per_token)
    return min(cap, rows_for_budget(config.kv_memory_mib, max_len, bytes_per_token)), None


def make_cache(
    model: Transformer,
    config: EngineConfig,
    n_slots: int,
    max_len: int,
    kv_blocks: int | None,
    dtype: torch.dtype,
    decoder=None,
) -> tuple[SlotKVCache | PagedKVCache, object]:
    """The engine's cache (K/V in ``dtype``) and its CUDA-graph decoder (None without one;
    ``decoder``: one to reuse, with its cache); see ContinuousEngine."""
    cfg, device = model.cfg, next(model.parameters()).device
    if decoder is not None:
        cache = decoder.slots
        if cache.n_slots != n_slots or cache.max_len != max_len or any(cache.active) or cache.k.dtype != dtype:
            raise ValueError(
                f"decoder cache has {cache.n_slots} slots of {cache.max_len} in {cache.k.dtype} "
                f"(active: {sum(cache.active)}); need {n_slots} idle slots of {max_len} in {dtype}"
            )
        return cache, decoder
    token_bytes = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * dtype.itemsize  # K and V, every layer
    block_size = config.block_size
    if config.kv == "slots":
        check_kv_fits(n_slots * max_len * token_bytes / MIB, device, "n_slots x max_len")
    else:
        n_blocks = default_kv_blocks(n_slots, max_len, block_size) if kv_blocks is None else kv_blocks
        check_kv_fits((n_blocks + 1) * block_size * token_bytes / MIB, device, "kv_memory_mib / kv_blocks")
    if config.kv == "slots" and not config.cuda_graph:  # a slot: max_len's blocks, reserved whole at admission
        n_blocks = n_slots * -(-max_len // block_size)
    try:
        if config.kv == "slots" and config.cuda_graph:  # the graphs replay dense slots
            cache = SlotKVCache(cfg.n_layers, n_slots, cfg.n_kv_heads, cfg.head_dim, max_len, dtype, device)
        else:
            cache = PagedKVCache(
                cfg.n_layers, n_slots, cfg.n_kv_heads, cfg.head_dim, n_blocks, block_size, max_len, dtype, device
            )
    except (RuntimeError, MemoryError) as e:  # (the free memory said yes, the allocator no)
        raise ValueError(
            f"the KV cache could not be allocated on {device.type}: "
            f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        ) from None
    if isinstance(cache, PagedKVCache):
        cache.reserve_whole = config.kv == "slots"
    if config.cuda_graph:
        from tinyllm.kv.cuda_graph import SlotGraphDecoder

        decoder = SlotGraphDecoder(model, cache, buckets=config.buckets)
    return cache, decoder


def make_scheduler(cache: SlotKVCache | PagedKVCache, config: EngineConfig, model: Transformer) -> Scheduler:
    """The token-budget scheduler (with the pool's prefix cache on or off, and speculation's
    proposer), or the seed's."""
    if not config.chunked_prefill:
        return AdmissionScheduler(cache)
    cache.prefix_cache = config.prefix_caching
    return TokenBudgetScheduler(
        cache,
        config.budget,
        config.num_speculative_tokens,
        make_proposer(config, model) if config.num_speculative_tokens else None,
        config.speculative_disable_by_batch_size,
    )


def make_proposer(config: EngineConfig, model: Transformer) -> Proposer:
    """Speculation's proposer: prompt lookup, or the draft model ``speculative_model`` names,
    loaded on the target's device and in its dtype; refused (ValueError) unless it shares the
    target's vocabulary, the condition for its guesses to be the target's tokens."""
    if config.speculative_model is None:
        return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    from tinyllm.engine.draft_model import DraftModelProposer
    from tinyllm.model.checkpoint import CheckpointError, load_checkpoint

    weight = next(model.parameters())
    path = resolve_draft_model(config.speculative_model)
    try:
        draft, _ = load_checkpoint(path, device=weight.device, dtype=weight.dtype)
    except (CheckpointError, OSError, ValueError, RuntimeError) as e:  # (bad JSON, bad weights too)
        raise ValueError(f"speculative_config model {config.speculative_model!r}: {e}") from None
    if draft.cfg.max_seq_len <= config.num_speculative_tokens:
        raise ValueError(
            f"speculative_config model {config.speculative_model!r} has a context of {draft.cfg.max_seq_len} tokens: "
            f"too short to draft {config.num_speculative_tokens}"
        )
    if draft.cfg.vocab_size != model.cfg.vocab_size:
        raise ValueError(
            f"speculative_config model {config.speculative_model!r} has a vocabulary of {draft.cfg.vocab_size:,} "
            f"tokens, the model {model.cfg.vocab_size:,}: a draft model must share the model's tokenizer"
        )
    return DraftModelProposer(draft)
