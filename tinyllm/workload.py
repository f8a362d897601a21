"""Prompt workload files (JSONL): one request per line, validated whole before anything runs.

    {"prompt": "ROMEO:", "max_new_tokens": 80, "temperature": 0.8, "top_k": 40, "arrival_s": 0.5}

``prompt`` is required; ``max_new_tokens``, ``arrival_s`` (seconds after loading), ``stop_at_eos``,
``priority`` and ``tenant`` (the scheduling policies'), the sampling fields (``temperature``, ``top_k``, ``top_p``, ``min_p``, ``presence_penalty``,
``frequency_penalty``, ``repetition_penalty``, ``seed``: a line that sets any of them gets its own
Sampling, the ones it leaves out at their defaults), the stop fields (``stop``,
``stop_token_ids``, ``min_tokens``) and ``slo`` (that request's latency targets, in place of the
run's --slo: ``"ttft=300ms"`` or ``{"ttft": "300ms", "tpot": "50ms"}``) are optional. Blank lines are skipped. A file with any bad
line is refused whole, with ``file:line: what is wrong``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from tinyllm.request import (
    MAX_N,
    ContextTooLong,
    RequestSettings,
    Sampling,
    SamplingError,
    check_fits,
    check_priority,
    check_stop,
    check_tenant,
    check_token_stops,
)
from tinyllm.slo import SLO

NEW_TOKENS = 64  # what the race, whatif, tune and bench make for a line without max_new_tokens
SAMPLING_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
)
STOP_FIELDS = ("stop", "stop_token_ids", "min_tokens")
SCHEDULING_FIELDS = ("priority", "tenant", "n")
FIELDS = {
    "prompt",
    "max_new_tokens",
    "arrival_s",
    "stop_at_eos",
    "slo",
    *SAMPLING_FIELDS,
    *STOP_FIELDS,
    *SCHEDULING_FIELDS,
}


class WorkloadError(ValueError):
    """The first problem found in a workload file, as ``file:line: message``."""


@dataclass(frozen=True)
class WorkItem:
    prompt: str
    max_new_tokens: int | None = None  # None: the caller's default
    sampling: Sampling | None = None  # None: the caller's default
    arrival_s: float = 0.0
    stop_at_eos: bool | None = None  # None: the caller's default
    line: int = 0
    stop: tuple[str, ...] | None = None  # None: the caller's default (so are the two below)
    stop_token_ids: tuple[int, ...] | None = None
    min_tokens: int | None = None
    priority: int | None = None  # None: the caller's default (so is tenant)
    tenant: str | None = None
    n: int | None = None  # samples of this prompt (forks sharing its blocks)
    slo: SLO | None = None  # this request's latency targets (None: the run's --slo)

    def settings(self, defaults: RequestSettings) -> RequestSettings:
        """This line's settings: what it says, the caller's ``defaults`` for what it leaves out."""
        said = {name: getattr(self, name) for name in (*STOP_FIELDS, *SCHEDULING_FIELDS)}
        mine = {name: value for name, value in said.items() if value is not None}
        return replace(
            defaults,
            sampling=self.sampling or defaults.sampling,
            max_new_tokens=self.max_new_tokens or defaults.max_new_tokens,
            stop_at_eos=defaults.stop_at_eos if self.stop_at_eos is None else self.stop_at_eos,
            **mine,
        )


def bundled_workloads() -> dict[str, Path]:
    """The example workloads shipped inside the package (the repo's ``prompts/``), name → file.
    Found through importlib.resources, so they are there in an installed wheel too."""
    root = resources.files("tinyllm") / "data" / "prompts"
    if not root.is_dir():
        return {}
    files = sorted((f for f in root.iterdir() if f.name.endswith(".jsonl")), key=lambda f: f.name)
    return {f.name.removesuffix(".jsonl"): Path(str(f)) for f in files}


def resolve_workload(name_or_path: str | Path) -> Path:
    """A path to an existing file, else a bundled workload's name (``burst`` or ``burst.jsonl``).
    WorkloadError saying what exists when it is neither."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    bundled = bundled_workloads()
    name = str(name_or_path).removesuffix(".jsonl")
    if name in bundled:
        return bundled[name]
    names = ", ".join(bundled) or "none found"
    raise WorkloadError(f"{name_or_path}: no such file, and not a bundled workload (bundled: {names})")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def parse_line(obj, where: str) -> WorkItem:
    if not isinstance(obj, dict):
        raise WorkloadError(f'{where}: expected a JSON object like {{"prompt": "..."}}, got {type(obj).__name__}')
    unknown = sorted(set(obj) - FIELDS)
    if unknown:
        raise WorkloadError(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(FIELDS))}")
    prompt = obj.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise WorkloadError(f"{where}: 'prompt' is required and must be a non-empty string")
    new = obj.get("max_new_tokens")
    if new is not None and (not isinstance(new, int) or isinstance(new, bool) or new < 1):
        raise WorkloadError(f"{where}: max_new_tokens must be an integer >= 1, got {new!r}")
    arrival = obj.get("arrival_s", 0.0)
    if not _number(arrival) or not math.isfinite(arrival) or arrival < 0:
        raise WorkloadError(f"{where}: arrival_s must be a number of seconds >= 0, got {arrival!r}")
    eos = obj.get("stop_at_eos")
    if eos is not None and not isinstance(eos, bool):
        raise WorkloadError(f"{where}: stop_at_eos must be true or false, got {eos!r}")
    sampling = None
    try:
        if any(k in obj for k in SAMPLING_FIELDS):
            sampling = Sampling(**{k: obj[k] for k in SAMPLING_FIELDS if k in obj})
        stop = None if "stop" not in obj else check_stop(obj["stop"])
        stop_ids = obj.get("stop_token_ids")
        check_token_stops(() if stop_ids is None else stop_ids, obj.get("min_tokens", 0), new, None)
        priority = None if "priority" not in obj else check_priority(obj["priority"])
        tenant = None if "tenant" not in obj else check_tenant(obj["tenant"])
        n = obj.get("n")
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N):
            raise WorkloadError(f"{where}: n must be an integer from 1 to {MAX_N}, got {n!r}")
        slo = None if "slo" not in obj else SLO.from_value(obj["slo"])
    except (SamplingError, ValueError) as e:
        raise WorkloadError(f"{where}: {e}") from None
    return WorkItem(
        prompt,
        new,
        sampling,
        float(arrival),
        eos,
        stop=stop,
        stop_token_ids=None if stop_ids is None else tuple(stop_ids),
        min_tokens=obj.get("min_tokens"),
        priority=priority,
        tenant=tenant,
        n=n,
        slo=slo,
    )


def load_workload(path: str | Path) -> list[WorkItem]:
    """Parse and validate a whole file; raises WorkloadError naming the file and line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise WorkloadError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise WorkloadError(f"{path}: is a directory, expected a .jsonl file") from None
    except UnicodeDecodeError as e:
        raise WorkloadError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read ({e.strerror})") from None
    items = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
        item = parse_line(obj, where)
        items.append(replace(item, line=n))
    if not items:
        raise WorkloadError(f"{path}: no requests (expected one JSON object per line)")
    return items


def samples(items: list[WorkItem], ids: list[list[int]]):
    """(item, its token ids) once per request it makes: a line with ``n`` samples makes n (the race
    and tinyllm whatif run each as its own request; they once ran one, its work lost)."""
    return ((it, i) for it, i in zip(items, ids) for _ in range(it.n or 1))


def tokenize_checked(
    items: list[WorkItem], path: str | Path, encode, max_len: int, default_new: int
) -> list[list[int]]:
    """Tokenize every prompt and check it fits ``max_len`` with its max_new_tokens; returns the ids."""
    out = []
    for it in items:
        ids = encode(it.prompt)
        new = it.max_new_tokens or default_new
        if not ids:
            raise WorkloadError(f"{path}:{it.line}: the prompt encodes to no tokens")
        if (it.min_tokens or 0) > new:
            raise WorkloadError(f"{path}:{it.line}: min_tokens {it.min_tokens} is more than max_new_tokens {new}")
        try:
            check_fits(len(ids), new, max_len, "the context")
        except ContextTooLong as e:
            raise WorkloadError(f"{path}:{it.line}: {e}") from None
        out.append(ids)
    return out
