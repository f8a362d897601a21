"""One engine config: every setting of a ContinuousEngine, in one frozen, keyword-only dataclass.

Where a setting is spelled once: its field here (name, default, what it means, its check, and
its line in ``_settings_from_args``), its command-line option in ``tinyllm/engine_args.py`` (its
definition in ``engine_options`` and the commands that offer it in ``COMMAND_ENGINE_OPTIONS``),
and the code that reads it: three files. The app, the server, the race and its lanes, what-if
and tune then carry it in their EngineConfig. A race lane, a what-if point or a tuning candidate
is ``config.replace(...)`` of the run's config.

Checked here, once, is everything that can be checked without a model (types, ranges, settings
that need one another); what needs the model (``max_len`` against its context, the KV budget
turned into slots or blocks, the device's free memory) is checked when an engine is built
(``tinyllm/engine/build.py``). Every refusal is a one-line ValueError naming the setting and
what is allowed. No torch: the app and every command line import this.

Names follow vLLM where vLLM has the setting (``max_num_seqs``, ``max_num_batched_tokens`` is
``max_batched_tokens`` here, ``enable_prefix_caching`` is ``prefix_cache``,
``scheduling_policy``, ``kv_cache_dtype``, ``block_size``).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass
from typing import Any

from tinyllm.request import (
    DEFAULT_MAX_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    KV_CACHE_DTYPES,
    SCHEDULING_POLICIES,
    is_int,
)

DEFAULT_SLOTS = 8  # the cap on running sequences without a KV budget (each holds a slot)
DEFAULT_BLOCK_SIZE = 16  # tokens per KV block (paged)
DEFAULT_THREADS = 2  # torch CPU threads for a command's engine
ONE_THREAD = 1  # the app's engine process and tune's calibration: beside a busy core a second thread waits


def is_device_name(device: object) -> bool:
    """cpu, cuda or cuda:N: the devices an engine runs on (whether CUDA is there is another check)."""
    return isinstance(device, str) and (device in ("cpu", "cuda") or (device[:5] == "cuda:" and device[5:].isdigit()))


class KVLayout(str, enum.Enum):
    """How the KV cache is stored: a slot of ``max_len`` per sequence, or a pool of blocks."""

    SLOTS = "slots"
    PAGED = "paged"


def parse_mib(text: str) -> float | None:
    """A KV memory size in MiB written as text (a lane's kv_mib=, a search's values): a finite
    number > 0, else None (the caller's error names where it was written)."""
    try:
        mib = float(text)
    except ValueError:
        return None
    return mib if 0 < mib < float("inf") else None


def _positive_int(name: str, x: Any, allow_none: bool = True) -> None:
    if (x is None and allow_none) or (is_int(x) and x >= 1):
        return
    raise ValueError(f"{name} must be an integer >= 1, got {x!r}")


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Every engine setting. ``EngineConfig()`` is the seed's engine: 8 slots of the model's
    context, the seed's scheduler (a padded prefill of newcomers, then a decode of every slot).
    ``EngineConfig.best()`` is the engine's best path: paged KV, the token budget with chunked
    prefill, prefix caching."""

    kv: str = KVLayout.SLOTS.value
    """"slots" (every sequence reserves ``max_len`` tokens) or "paged" (blocks follow real use)."""
    max_num_seqs: int | None = None
    """The cap on running sequences (the slot count). None: ``DEFAULT_SLOTS`` without a KV
    budget, ``DEFAULT_MAX_NUM_SEQS`` with one (at most the token budget)."""
    max_len: int | None = None
    """Tokens per sequence, prompt and output (None: the model's context)."""
    kv_memory_mib: float | None = None
    """The KV memory budget in MiB: sizes the cache (slots: rows of max_len; paged: blocks).
    Excludes ``kv_blocks``."""
    kv_blocks: int | None = None
    """Paged: the pool's blocks (None: the same memory as ``max_num_seqs`` slots of max_len)."""
    block_size: int = DEFAULT_BLOCK_SIZE
    """Paged: tokens per block."""
    chunked_prefill: bool = False
    """Paged: the token-budget scheduler (decodes and prefill chunks in one ragged pass)."""
    max_batched_tokens: int | None = None
    """With chunked prefill: tokens per step (None: ``DEFAULT_MAX_BATCHED_TOKENS``)."""
    prefix_cache: bool | None = None
    """With chunked prefill: reuse cached prompt prefixes (None: on with chunked prefill)."""
    scheduling_policy: str = "fcfs"
    """The waiting queue's order and whom to preempt: ``SCHEDULING_POLICIES``."""
    kv_cache_dtype: str = "auto"
    """The KV cache's element type: auto (the model's), float32, bfloat16."""
    cuda_graph: bool = False
    """CUDA, slots only: replay the decode step as a CUDA graph per attention-window bucket."""
    buckets: tuple[int, ...] | None = None
    """With cuda_graph: the attention-window buckets captured (None: the decoder's default)."""
    device: str | None = None
    """Where a command builds its model: cpu, cuda, cuda:N (None: cuda when available)."""
    threads: int | None = None
    """torch CPU threads for a command's engine (None: torch's default)."""
    seed: int | None = None
    """The seed of the generator unseeded requests share (None: torch's global generator)."""
    num_speculative_tokens: int = 0
    """With chunked prefill: speculation, tokens drafted per step for each greedy or unseeded
    sampled request (0: off; vLLM's num_speculative_tokens). engine/speculate.py."""
    speculative_model: str | None = None
    """Speculation by a draft model (vLLM's method "draft_model"): its checkpoint directory, or
    "tinyllm-shakespeare-draft" (the bundled model's, shipped). None: n-gram prompt lookup."""
    prompt_lookup_max: int = 3
    """Speculation: the longest context suffix looked up for a draft (vLLM's prompt_lookup_max)."""
    prompt_lookup_min: int = 1
    """Speculation: the shortest (vLLM's prompt_lookup_min)."""
    speculative_disable_by_batch_size: int | None = 4
    """Speculation: no drafts in a step where this many sequences decode or more (vLLM's
    disable_by_batch_size; None: never off). Verifying drafts costs tokens a large batch has no
    spare compute for: on the 2-core CPU k=4 ran 0.5-0.7x at 16-64 sequences (docs/benchmarks.md)."""

    def __post_init__(self) -> None:
        if self.kv not in (KVLayout.SLOTS.value, KVLayout.PAGED.value):
            raise ValueError(f"kv must be 'slots' or 'paged', got {self.kv!r}")
        _positive_int("max_num_seqs", self.max_num_seqs)
        if self.max_len is not None and (not is_int(self.max_len) or self.max_len < 2):
            raise ValueError(f"max_len must be an integer >= 2, got {self.max_len!r}")
        mib = self.kv_memory_mib
        if mib is not None and (
            isinstance(mib, bool) or not isinstance(mib, (int, float)) or not 0 < mib < float("inf")
        ):
            raise ValueError(f"kv_memory_mib must be a number of MiB > 0, got {mib!r}")
        _positive_int("kv_blocks", self.kv_blocks)
        _positive_int("block_size", self.block_size, allow_none=False)
        if mib is not None and self.kv_blocks is not None:
            raise ValueError("give kv_memory_mib or kv_blocks, not both (the budget sizes the pool)")
        if self.kv != KVLayout.PAGED.value:  # settings of a block pool, refused for slots
            if self.kv_blocks is not None:
                raise ValueError("kv_blocks needs kv='paged' (the slot cache has no blocks)")
            if self.block_size != DEFAULT_BLOCK_SIZE:
                raise ValueError(f"block_size needs kv='paged' (the slot cache has no blocks), got {self.block_size}")
            if self.chunked_prefill is True:
                raise ValueError("chunked_prefill needs kv='paged' (the token-budget scheduler allocates blocks)")
        if not isinstance(self.chunked_prefill, bool):
            raise ValueError(f"chunked_prefill must be True or False, got {self.chunked_prefill!r}")
        if self.max_batched_tokens is not None and not self.chunked_prefill:
            raise ValueError("max_batched_tokens is the token-budget scheduler's: it needs chunked_prefill=True")
        if self.max_batched_tokens is not None and (not is_int(self.max_batched_tokens) or self.max_batched_tokens < 1):
            raise ValueError(
                f"max_batched_tokens (the token budget per step) must be an integer >= 1, "
                f"got {self.max_batched_tokens!r}"
            )
        if self.prefix_cache is not None and not isinstance(self.prefix_cache, bool):
            raise ValueError(
                f"prefix_cache must be True, False or None (on with chunked prefill), got {self.prefix_cache!r}"
            )
        if self.prefix_cache and not self.chunked_prefill:
            raise ValueError("prefix_cache needs chunked_prefill=True (the token-budget scheduler looks prefixes up)")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"scheduling policy must be one of {', '.join(SCHEDULING_POLICIES)}, got {self.scheduling_policy!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:  # (command lines take fp32/bf16 too: args.py)
            raise ValueError(
                f"kv_cache_dtype must be one of {', '.join(map(repr, KV_CACHE_DTYPES))}, got {self.kv_cache_dtype!r}"
            )
        if not isinstance(self.cuda_graph, bool):
            raise ValueError(f"cuda_graph must be True or False, got {self.cuda_graph!r}")
        if self.cuda_graph and self.kv != KVLayout.SLOTS.value:
            raise ValueError("cuda_graph supports kv='slots' only (paged: not yet)")
        if self.buckets is not None and not self.cuda_graph:
            raise ValueError("buckets are cuda_graph's attention windows: give cuda_graph=True with them")
        if self.device is not None and not is_device_name(self.device):
            raise ValueError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")
        _positive_int("threads", self.threads)
        if self.seed is not None and not is_int(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not is_int(self.num_speculative_tokens) or not 0 <= self.num_speculative_tokens <= 16:
            raise ValueError(
                f"num_speculative_tokens must be an integer from 0 (off) to 16, got {self.num_speculative_tokens!r}"
            )
        if self.num_speculative_tokens and not self.chunked_prefill:
            raise ValueError(
                "num_speculative_tokens needs chunked_prefill=True (drafts ride the token-budget scheduler)"
            )
        draft = self.speculative_model
        if draft is not None and (not isinstance(draft, str) or not draft):
            raise ValueError(f"speculative_model must be a checkpoint directory (a string), got {draft!r}")
        if draft is not None and not self.num_speculative_tokens:
            raise ValueError("speculative_model needs num_speculative_tokens >= 1 (tokens drafted per step)")
        off = self.speculative_disable_by_batch_size
        if off is not None and (not is_int(off) or off < 1):
            raise ValueError(f"speculative_disable_by_batch_size must be an integer >= 1 or None, got {off!r}")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if not (is_int(lo) and is_int(hi) and 1 <= lo <= hi <= 64):
            raise ValueError(
                f"prompt_lookup_min and prompt_lookup_max must be integers with 1 <= min <= max <= 64, got {lo!r}, {hi!r}"
            )

    # -- derived values ----------------------------------------------------------------------
    @property
    def budget(self) -> int:
        """The token budget per step (the default filled in)."""
        return DEFAULT_MAX_BATCHED_TOKENS if self.max_batched_tokens is None else self.max_batched_tokens

    @property
    def prefix_caching(self) -> bool:
        """Whether prefixes are cached (the default filled in: on with chunked prefill)."""
        return self.chunked_prefill if self.prefix_cache is None else self.prefix_cache

    @property
    def seqs_cap(self) -> int:
        """The cap on running sequences, its default filled in (before a budget buys fewer)."""
        if self.max_num_seqs is not None:
            return self.max_num_seqs
        if self.kv_memory_mib is None:
            return DEFAULT_SLOTS
        cap = DEFAULT_MAX_NUM_SEQS
        return min(cap, self.budget) if self.chunked_prefill else cap

    @property
    def scheduler_name(self) -> str:
        """Which scheduler plans: "token budget" (chunked prefill) or "prefill then decode"."""
        return "token budget" if self.chunked_prefill else "prefill then decode"

    # -- variations --------------------------------------------------------------------------
    def replace(self, **changes: Any) -> EngineConfig:
        """A copy with ``changes`` (checked again): a race lane, a what-if point."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def best(cls, **changes: Any) -> EngineConfig:
        """The engine's best path: paged KV, the token budget with chunked prefill, prefix caching."""
        return cls(**{"kv": "paged", "chunked_prefill": True, **changes})

    @classmethod
    def settings(cls) -> tuple[str, ...]:
        """The names of the settings."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def changed(self) -> dict[str, Any]:
        """The settings that differ from the defaults, by name (what a title or a report shows)."""
        base = EngineConfig()
        return {name: getattr(self, name) for name in self.settings() if getattr(self, name) != getattr(base, name)}

    def as_dict(self) -> dict[str, Any]:
        """Every setting as plain JSON values (recordings, reports)."""
        out = {name: getattr(self, name) for name in self.settings()}
        out["buckets"] = list(self.buckets) if self.buckets is not None else None
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EngineConfig:
        """The config ``as_dict`` wrote; an unknown name is refused, naming the settings."""
        unknown = sorted(set(values) - set(cls.settings()))
        if unknown:
            raise ValueError(
                f"unknown engine setting(s) {', '.join(unknown)}; the settings are {', '.join(cls.settings())}"
            )
        values = dict(values)
        if values.get("buckets") is not None:
            values["buckets"] = tuple(values["buckets"])
        return cls(**values)

    @classmethod
    def from_args(cls, args: Any, **decided: Any) -> EngineConfig:
        """The config a command line asked for (options added by ``tinyllm.engine_args.add_engine_args``);
        ``decided``: values that stand for options the command decides itself, read as if typed
        (the app's layout and max_len, the race's paged pool)."""
        return cls(**_settings_from_args(args, decided))


def _settings_from_args(args: Any, decided: dict[str, Any]) -> dict[str, Any]:
    """EngineConfig's keywords for what a command line set (a None is left to the config)."""

    def get(name: str) -> Any:
        return decided[name] if name in decided else getattr(args, name, None)

    kv_memory = get("kv_memory")
    paged, chunked = get("kv") == "paged" or get("chunked_prefill"), get("chunked_prefill")
    settings = {
        "max_num_seqs": get("max_num_seqs") if kv_memory is not None else get("slots"),
        "kv_memory_mib": kv_memory,
        "max_len": get("max_len"),
        "kv": get("kv"),
        "chunked_prefill": chunked,
        "prefix_cache": get("prefix_cache"),
        "max_batched_tokens": get("max_batched_tokens") if chunked else None,
        "block_size": get("block_size") if paged else None,
        "kv_blocks": get("kv_blocks") if paged else None,
        **{name: get(name) for name in ("scheduling_policy", "kv_cache_dtype", "device", "threads", "seed")},
        **(get("speculative_config") or {}),  # --speculative-config: its engine settings
    }
    return {k: v for k, v in settings.items() if v is not None}


def speculative_settings(spec: Any) -> dict[str, Any]:
    """vLLM's ``speculative_config`` (a dict, or its JSON as a command line gives it) as the
    engine's settings: method "ngram" (prompt lookup: ``prompt_lookup_max`` / ``prompt_lookup_min``)
    or "draft_model" (``model``: a checkpoint directory, or "tinyllm-shakespeare-draft"), each with
    ``num_speculative_tokens`` and ``disable_by_batch_size``. As in vLLM, a config without a method
    is "draft_model" when it names a model other than "ngram", else "ngram" (vLLM would also tell
    EAGLE, Medusa or MTP weights from their config: not implemented here). Any other method or
    key is refused by name (ValueError)."""
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError as e:
            raise ValueError(f"speculative_config is not valid JSON: {e}") from None
    if spec is None:
        return {}
    if not isinstance(spec, dict):
        raise ValueError(f"speculative_config must be a dict (vLLM's keys), got {type(spec).__name__}")
    model = spec.get("model")
    method = spec.get("method") or ("draft_model" if model not in (None, "ngram", "[ngram]") else "ngram")
    method = "ngram" if method == "[ngram]" else method  # (vLLM takes both spellings)
    common = {"method", "num_speculative_tokens", "disable_by_batch_size"}
    takes = {
        "ngram": common
        | {"prompt_lookup_max", "prompt_lookup_min"}
        | ({"model"} if model in ("ngram", "[ngram]") else set()),
        "draft_model": common | {"model"},
    }
    if method not in takes:
        raise ValueError(
            f"speculative_config method {method!r} is not supported: tinyllm speculates by n-gram prompt lookup "
            "('ngram') or a draft model ('draft_model'); EAGLE, Medusa and MTP are not implemented"
        )
    unknown = sorted(set(spec) - takes[method])
    if unknown:
        raise ValueError(
            f"speculative_config: {', '.join(unknown)} not supported with method {method!r} "
            f"(takes {', '.join(sorted(takes[method]))})"
        )
    out = {k: spec[k] for k in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min") if k in spec}
    if "disable_by_batch_size" in spec:
        out["speculative_disable_by_batch_size"] = spec["disable_by_batch_size"]
    if method == "draft_model":
        if not isinstance(model, str) or not model:
            raise ValueError(
                "speculative_config method 'draft_model' needs model: a checkpoint directory sharing the "
                "model's tokenizer, or 'tinyllm-shakespeare-draft' (the bundled model's draft)"
            )
        out["speculative_model"] = model
    if "num_speculative_tokens" not in out:
        raise ValueError("speculative_config needs num_speculative_tokens (tokens drafted per step)")
    return out
