"""The settings ``tinyllm tune`` searches, their values, and ``--search SETTING=V1,V2,…``.

A point is one engine configuration: a value for every setting. Its names are EngineConfig's
(vLLM's where vLLM has the setting: config.py), so a winner reads as the options that set it.
Settings a point cannot use collapse: without chunked prefill the token budget and the prefix
cache do not apply (the engine refuses them), so those points are one point, not several. No
torch: the command line checks ``--search`` before the model loads.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

from tinyllm.config import DEFAULT_BLOCK_SIZE, DEFAULT_SLOTS, parse_mib
from tinyllm.request import DEFAULT_MAX_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS, SCHEDULING_POLICIES, kv_dtype_name


class SearchError(ValueError):
    """A ``--search`` the tuner cannot use: one line naming what is allowed."""


@dataclass(frozen=True, order=True)
class Point:
    """One engine configuration (EngineConfig's names). ``kv_memory_mib`` None: the run's budget."""

    max_num_seqs: int = DEFAULT_SLOTS
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    chunked_prefill: bool = True
    prefix_cache: bool = True
    block_size: int = DEFAULT_BLOCK_SIZE
    scheduling_policy: str = "fcfs"
    kv_cache_dtype: str = "auto"
    kv_memory_mib: float | None = None
    num_speculative_tokens: int = 0  # n-gram speculation's draft length (engine/speculate.py); 0: off

    def canonical(self) -> Point:
        """The point with the settings it cannot use set to their defaults (so equal engines are
        equal points): without chunked prefill, no token budget, no prefix cache, no speculation."""
        if self.chunked_prefill:
            return self
        return replace(
            self, max_batched_tokens=DEFAULT_MAX_BATCHED_TOKENS, prefix_cache=False, num_speculative_tokens=0
        )

    def valid(self) -> str:
        """ "" if an engine can run it, else why not (the token budget must cover every running
        sequence: each decodes a token per step)."""
        if self.chunked_prefill and self.max_batched_tokens < self.max_num_seqs:
            return f"max_batched_tokens {self.max_batched_tokens} < max_num_seqs {self.max_num_seqs}"
        return ""

    def words(self, base: Point | None = None) -> str:
        """The settings that differ from ``base`` (all when None), short: ``seqs 4, budget 128``."""
        out = []
        for f in fields(self):
            v = getattr(self, f.name)
            if base is not None and v == getattr(base, f.name):
                continue
            if f.name in ("max_batched_tokens", "prefix_cache", "num_speculative_tokens") and not self.chunked_prefill:
                continue
            out.append(f"{SHORT[f.name]} {_say(v)}")
        return ", ".join(out) or "the defaults"

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


SHORT = {
    "max_num_seqs": "seqs",
    "max_batched_tokens": "budget",
    "chunked_prefill": "chunked",
    "prefix_cache": "prefix",
    "block_size": "block",
    "scheduling_policy": "policy",
    "kv_cache_dtype": "kv dtype",
    "kv_memory_mib": "KV MiB",
    "num_speculative_tokens": "spec k",
}


def _say(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def defaults(kv_budget_given: bool) -> Point:
    """The engine's defaults (what ``tinyllm serve`` runs): up to 64 sequences with a KV budget
    (vLLM's max_num_seqs), else 8."""
    return Point(max_num_seqs=DEFAULT_MAX_NUM_SEQS if kv_budget_given else DEFAULT_SLOTS)


# -- the values a setting takes, as typed --------------------------------------------------------


def _int(name: str, text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise SearchError(f"--search {name}: {text!r} is not an integer >= 1")
    return int(text)


def _ints(name: str, text: str) -> list[int]:
    """``4,8,16`` or a doubling range ``4..32`` (4, 8, 16, 32)."""
    if ".." in text:
        lo_text, _, hi_text = text.partition("..")
        lo, hi = _int(name, lo_text), _int(name, hi_text)
        if lo > hi:
            raise SearchError(f"--search {name}={text}: an empty range (LO..HI doubles from LO up to HI; LO <= HI)")
        out = []
        while lo <= hi:
            out.append(lo)
            lo *= 2
        return out
    return [_int(name, v) for v in text.split(",")]


def _counts(name: str, text: str) -> list[int]:
    """``0,2,4``: integers from 0 (off) to 16, the engine's range."""
    out = []
    for v in text.split(","):
        if not (v.isascii() and v.isdigit()) or int(v) > 16:
            raise SearchError(f"--search {name}: {v!r} is not an integer from 0 (off) to 16")
        out.append(int(v))
    return out


def _switch(name: str, text: str) -> list[bool]:
    out = []
    for v in text.split(","):
        if v not in ("on", "off"):
            raise SearchError(f"--search {name}: {v!r} is not on or off")
        out.append(v == "on")
    return out


def _policies(name: str, text: str) -> list[str]:
    for v in text.split(","):
        if v not in SCHEDULING_POLICIES:
            raise SearchError(f"--search {name}: {v!r} is not a policy; choose from {', '.join(SCHEDULING_POLICIES)}")
    return text.split(",")


def _dtypes(name: str, text: str) -> list[str]:
    out = []
    for v in text.split(","):
        if kv_dtype_name(v) is None:
            raise SearchError(f"--search {name}: {v!r} is not a KV dtype; choose from auto, float32, bfloat16")
        out.append(kv_dtype_name(v))
    return out


def _mibs(name: str, text: str) -> list[float]:
    out = []
    for v in text.split(","):
        mib = parse_mib(v)
        if mib is None:
            raise SearchError(f"--search {name}: {v!r} is not a number of MiB > 0")
        out.append(mib)
    return out


# setting -> (how its values are read, what they may be, the default search's values)
SETTINGS: dict[str, tuple[Callable[[str, str], list], str, tuple]] = {
    "max_num_seqs": (_ints, "integers >= 1, or LO..HI (doubling)", (4, 8, 16, 32)),
    "max_batched_tokens": (_ints, "integers >= 1, or LO..HI (doubling)", (128, 256, 512)),
    "chunked_prefill": (_switch, "on, off", (True, False)),
    "prefix_cache": (_switch, "on, off", (True, False)),
    "block_size": (_ints, "integers >= 1, or LO..HI (doubling)", (DEFAULT_BLOCK_SIZE,)),
    "scheduling_policy": (_policies, ", ".join(SCHEDULING_POLICIES), ("fcfs", "shortest-first")),
    "kv_cache_dtype": (_dtypes, "auto, float32, bfloat16", ("auto", "bfloat16")),
    "kv_memory_mib": (_mibs, "MiB > 0", ()),
    "num_speculative_tokens": (_counts, "integers from 0 (off) to 16 (n-gram speculation, on the real model)", ()),
}
ALIASES = {
    "max_num_batched_tokens": "max_batched_tokens",  # vLLM's names
    "enable_prefix_caching": "prefix_cache",
    "enable_chunked_prefill": "chunked_prefill",
    "kv_memory": "kv_memory_mib",
    "policy": "scheduling_policy",
    "spec": "num_speculative_tokens",
}


def setting_name(text: str) -> str:
    """A setting as typed (dashes or underscores, vLLM's names too) -> its name, or SearchError."""
    name = text.strip().replace("-", "_")
    name = ALIASES.get(name, name)
    if name not in SETTINGS:
        raise SearchError(f"--search: unknown setting {text!r}; settings: {', '.join(SETTINGS)}")
    return name


def parse_search(args: list[str] | None) -> dict[str, tuple]:
    """``--search`` arguments -> setting -> its values, in the order given (duplicates dropped).
    None or empty: the default search (every setting with default values)."""
    if not args:
        return {k: v for k, (_, _, v) in SETTINGS.items() if v}
    out: dict[str, tuple] = {}
    for arg in args:
        key, eq, text = arg.partition("=")
        name = setting_name(key)
        if not eq or not text.strip(",").strip():
            raise SearchError(f"--search {key}: an empty range; give values, e.g. {key}={_example(name)}")
        if name in out:
            raise SearchError(f"--search {key} is given twice: give each setting once, its values separated by commas")
        read, _, _ = SETTINGS[name]
        values = read(key, text.strip())
        out[name] = tuple(dict.fromkeys(values))
    return out


def _example(name: str) -> str:
    return {
        "chunked_prefill": "on,off",
        "prefix_cache": "on,off",
        "scheduling_policy": "fcfs,shortest-first",
        "kv_cache_dtype": "auto,bfloat16",
        "kv_memory_mib": "8,16,32",
    }.get(name, "4,8,16")


def points(space: dict[str, tuple], base: Point) -> list[Point]:
    """Every distinct valid point of the grid (the other settings at ``base``), in the grid's
    order (a point whose token budget cannot cover its sequences is left out)."""
    names = list(space)
    seen: dict[Point, None] = {}
    for values in itertools.product(*(space[n] for n in names)):
        p = replace(base, **dict(zip(names, values))).canonical()
        if not p.valid():
            seen.setdefault(p, None)
    return list(seen)


def grid_size(space: dict[str, tuple]) -> int:
    n = 1
    for values in space.values():
        n *= len(values)
    return n
