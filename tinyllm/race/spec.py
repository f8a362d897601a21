"""A race lane's settings as the user writes them: ``--lanes fcfs priority "fair budget=64"``.

A lane is one engine with its own settings. Each lane is one argument: words separated by
spaces or commas, each either a bare word (a lane kind: ``static``, ``continuous``, ``chunked``;
or a scheduling policy, meaning a token-budget lane with that policy) or ``key=value``:

    policy=fcfs|priority|shortest-first|fair   budget=N (tokens per step)   slots=N
    block=N (tokens per KV block)   blocks=N (KV pool size)   prefix=on|off   chunked=on|off
    kv=slots|paged (a continuous lane's cache)   kv_mib=MiB (the lane's KV memory budget)
    kv_dtype=auto|float32|bfloat16 (fp32, bf16; the lane's KV cache element type; bfloat16: twice the tokens a MiB holds)
    spec=N (a token-budget lane's speculation: tokens drafted per step, by n-gram lookup or as
    whatif's --speculative-config says; "chunked" and "chunked spec=4" race it off against on)

With a KV memory budget (``kv_mib=``, or the race's ``--kv-memory`` for every lane) the budget
sizes the lane: static batching and the slot cache get the rows of max_len it buys, a paged lane
the blocks it buys, run by up to max_num_seqs sequences (engine/build.py). ``slots=`` then caps
the lane's sequences (max_num_seqs) instead of setting them; ``blocks=`` is refused (the budget
sizes the pool).

A single argument made only of bare words separated by commas is a list of lanes, one per
word (``--lanes static,chunked``, the race's original form). No torch: the app checks lanes
before the engine process starts, so a typo is a one-line error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from tinyllm.config import parse_mib
from tinyllm.request import KV_CACHE_DTYPES, SCHEDULING_POLICIES, kv_dtype_name

KINDS = ("static", "continuous", "chunked")
KEYS = ("policy", "budget", "slots", "block", "blocks", "prefix", "chunked", "kv", "kv_mib", "kv_dtype", "spec")
DEFAULT_LANES = KINDS
KIND_WORDS = {"static": "static batching", "continuous": "continuous batching", "chunked": "token budget"}


class LaneSpecError(ValueError):
    """A lane that cannot be built, in the user's words: which lane, which setting, what is allowed."""


@dataclass(frozen=True)
class LaneSpec:
    label: str  # the lane's name on screen: what the user wrote
    kind: str = "chunked"  # one of KINDS
    policy: str = "fcfs"
    budget: int | None = None  # None: the race's default
    slots: int | None = None
    block_size: int | None = None
    kv_blocks: int | None = None
    prefix_cache: bool | None = None  # None: on for a chunked lane
    kv: str | None = None  # continuous lanes: "slots" (default) or "paged"
    kv_mib: float | None = None  # the lane's KV memory budget (None: the race's --kv-memory)
    kv_dtype: str | None = None  # the lane's KV cache dtype (None: the race's --kv-cache-dtype)
    spec: int | None = None  # speculation's tokens per draft (engine/speculate.py); None: off

    recorded: tuple[str, ...] = ()  # the fields taken from a recording (on_recording), "kind" included

    def describe(self) -> str:
        """Every setting that differs from the race's defaults, for the lane's subtitle; those taken
        from a recording after "as recorded:" (the lane's label says only its own)."""
        own = {k: v for k, v in vars(self).items() if k not in self.recorded}
        rec = [KIND_WORDS[self.kind]] if "kind" in self.recorded else []
        rec += setting_words({k: getattr(self, k) for k in self.recorded})
        said = ", ".join(setting_words(own, skip_fcfs=True))
        return "; ".join(filter(None, [said, rec and f"as recorded: {', '.join(rec)}"]))


def setting_words(fields: dict, skip_fcfs: bool = False) -> list[str]:
    """LaneSpec fields as a lane's subtitle says them (``blocks 48``, ``prefix cache on``)."""
    parts = []
    if fields.get("policy") is not None and not (skip_fcfs and fields["policy"] == "fcfs"):
        parts.append(f"policy {fields['policy']}")
    for name, key in (
        ("budget", "budget"),
        ("slots", "slots"),
        ("block", "block_size"),
        ("blocks", "kv_blocks"),
        ("kv", "kv"),
    ):
        if fields.get(key) is not None:
            parts.append(f"{name} {fields[key]}")
    if fields.get("kv_mib") is not None:
        parts.append(f"KV {fields['kv_mib']:g} MiB")
    if fields.get("kv_dtype") is not None:
        parts.append(f"KV {fields['kv_dtype']}")
    if fields.get("prefix_cache") is not None:
        parts.append(f"prefix cache {'on' if fields['prefix_cache'] else 'off'}")
    if fields.get("spec") is not None:
        parts.append(f"speculation k={fields['spec']}")
    return parts


def _int(lane: str, key: str, v: str) -> int:
    if not re.fullmatch(r"[0-9]+", v) or int(v) < 1:
        raise LaneSpecError(f"lane {lane!r}: {key} must be an integer >= 1, got {v!r}")
    return int(v)


def _mib(lane: str, key: str, v: str) -> float:
    mib = parse_mib(v)
    if mib is None:
        raise LaneSpecError(f"lane {lane!r}: {key} must be a number of MiB > 0, got {v!r}")
    return mib


def _switch(lane: str, key: str, v: str) -> bool:
    if v not in ("on", "off"):
        raise LaneSpecError(f"lane {lane!r}: {key} must be on or off, got {v!r}")
    return v == "on"


def parse_lane(text: str) -> LaneSpec:
    """One lane from its argument (see the module docstring); LaneSpecError says what is wrong."""
    label = " ".join(text.replace(",", " ").split())
    if not label:
        raise LaneSpecError("an empty lane: give a lane kind, a policy, or key=value settings")
    kind, fields = _read(label)
    return _checked(label, kind or "chunked", fields)


def _read(label: str) -> tuple[str | None, dict]:
    """The lane's own words: its kind (None: not said) and LaneSpec fields."""
    kind, fields, said = None, {}, set()
    for word in label.split():
        key, eq, v = word.partition("=")
        name = (
            "kind"
            if (not eq and word in KINDS) or key == "chunked"  # (chunked=on|off sets the kind)
            else "policy"
            if not eq and word in SCHEDULING_POLICIES
            else {"block": "block_size", "blocks": "kv_blocks"}.get(key, key)
        )
        if name in said:  # "fcfs priority": the last one won, silently
            raise LaneSpecError(
                f"lane {label!r}: {'its kind' if name == 'kind' else key if eq else name} is given "
                f"twice; a lane has one (give each its own lane)"
            )
        said.add(name)
        if not eq:
            if word in KINDS:
                kind = word
            elif word in SCHEDULING_POLICIES:
                fields["policy"] = word
            else:
                raise LaneSpecError(
                    f"lane {label!r}: {word!r} is neither a lane kind ({', '.join(KINDS)}) nor a "
                    f"policy ({', '.join(SCHEDULING_POLICIES)}); settings are key=value with key one "
                    f"of {', '.join(KEYS)}"
                )
        elif key == "policy":
            if v not in SCHEDULING_POLICIES:
                raise LaneSpecError(
                    f"lane {label!r}: policy must be one of {', '.join(SCHEDULING_POLICIES)}, got {v!r}"
                )
            fields["policy"] = v
        elif key in ("budget", "slots", "blocks", "block", "spec"):
            fields[{"block": "block_size", "blocks": "kv_blocks"}.get(key, key)] = _int(label, key, v)
        elif key == "kv_mib":
            fields["kv_mib"] = _mib(label, key, v)
        elif key == "kv_dtype":
            if kv_dtype_name(v) is None:
                raise LaneSpecError(
                    f"lane {label!r}: kv_dtype must be one of {', '.join(KV_CACHE_DTYPES)} (fp32, bf16), got {v!r}"
                )
            fields["kv_dtype"] = kv_dtype_name(v)
        elif key == "prefix":
            fields["prefix_cache"] = _switch(label, key, v)
        elif key == "chunked":
            kind = "chunked" if _switch(label, key, v) else "continuous"
        elif key == "kv":
            if v not in ("slots", "paged"):
                raise LaneSpecError(f"lane {label!r}: kv must be slots or paged, got {v!r}")
            fields["kv"] = v
        else:
            raise LaneSpecError(f"lane {label!r}: unknown setting {key!r}; settings: {', '.join(KEYS)}")
    return kind, fields


def _checked(label: str, kind: str, fields: dict, recorded: tuple[str, ...] = ()) -> LaneSpec:
    """The lane, once its settings go together."""
    if kind == "static" and set(fields) - {"slots", "kv_mib", "kv_dtype"}:
        raise LaneSpecError(
            f"lane {label!r}: static batching takes only slots= (its batch size), kv_mib= and kv_dtype="
        )
    if "kv_mib" in fields and "kv_blocks" in fields:
        raise LaneSpecError(f"lane {label!r}: kv_mib sizes the KV pool: drop blocks=")
    if kind == "chunked" and fields.get("kv") == "slots":
        raise LaneSpecError(f"lane {label!r}: a chunked (token-budget) lane needs the paged KV cache")
    if kind == "continuous" and (fields.get("budget") or fields.get("prefix_cache") or fields.get("spec")):
        raise LaneSpecError(f"lane {label!r}: budget, prefix and spec need chunked prefill (chunked=on)")
    if kind == "continuous" and fields.get("kv") != "paged" and ("block_size" in fields or "kv_blocks" in fields):
        raise LaneSpecError(f"lane {label!r}: block and blocks need the paged KV cache (kv=paged)")
    return LaneSpec(label, kind, **fields, recorded=recorded)


def parse_lanes(args: list[str] | tuple[str, ...] | None) -> tuple[LaneSpec, ...]:
    """Every lane, in the order given (None: the three default lanes). At least two; labels unique."""
    if not args:
        return tuple(LaneSpec(k, k) for k in DEFAULT_LANES)
    if len(args) == 1 and "," in args[0] and "=" not in args[0]:
        args = [w for w in args[0].split(",") if w.strip()]  # the old form: a list of lanes
    lanes = tuple(parse_lane(a) for a in args)
    seen: set[str] = set()
    for lane in lanes:
        if lane.label in seen:
            raise LaneSpecError(f"two lanes are both {lane.label!r}: give each lane different settings")
        seen.add(lane.label)
    if len(lanes) < 2:  # lanes compare with each other: a recording's own run is not one
        raise LaneSpecError(f"a race needs at least two lanes, got {len(lanes)}")
    return lanes


@dataclass(frozen=True)
class Recorded:
    """A recording's engine settings as lane settings: what a lane on its requests runs at unless
    it says otherwise (``on_recording``)."""

    kind: str  # "chunked" (the token-budget scheduler) or "continuous"
    fields: dict  # LaneSpec field -> the recorded value
    max_len: int
    missing: dict  # LaneSpec field -> (what it is, today's default): not in the header
    pool_tokens: int | None = None  # the paged pool's tokens (blocks x block size): kept if block size changes

    def without(self, names) -> Recorded:
        """Less the fields an option of the command sets for every lane (it wins over the recording)."""
        names = set(names)
        return replace(
            self,
            fields={k: v for k, v in self.fields.items() if k not in names},
            missing={k: v for k, v in self.missing.items() if k not in names},
        )

    def describe(self) -> str:
        return ", ".join([KIND_WORDS[self.kind], *setting_words(self.fields), f"max_len {self.max_len}"])


# The commands' options that set a recorded engine setting for every lane (option dest -> the
# Recorded fields it sets): given, each wins over the recording (tinyllm whatif and --race alike).
OPTION_FIELDS = {
    "slots": ("slots",),
    "block_size": ("block_size",),
    "kv_blocks": ("kv_blocks",),
    "max_batched_tokens": ("budget",),
    "kv_cache_dtype": ("kv_dtype",),
    "kv_memory": ("slots", "kv_blocks"),
}


def set_by_options(given: dict) -> list[str]:
    """The Recorded fields the options in ``given`` (dest -> value: those typed; None: not given)
    set."""
    return [f for dest, v in given.items() if dest in OPTION_FIELDS and v is not None for f in OPTION_FIELDS[dest]]


# The recorded fields each kind of lane takes (block and blocks: only on the paged cache).
TAKES = {
    "static": ("slots", "kv_dtype"),
    "continuous": ("kv", "slots", "policy", "kv_dtype", "block_size", "kv_blocks"),
    "chunked": ("slots", "policy", "kv_dtype", "budget", "prefix_cache", "block_size", "kv_blocks"),
}


def on_recording(
    lanes: tuple[LaneSpec, ...], rec: Recorded, block_size: int | None = None
) -> tuple[tuple[LaneSpec, ...], list[str]]:
    """The lanes at the recording's settings, each lane's own winning, so a lane that says only
    ``fcfs`` re-runs the recorded engine; and a note per recorded setting the header lacks that a
    lane falls back on today's default for. A lane that names no kind takes the recorded one,
    unless its own settings need chunked prefill (budget=, prefix=). A lane whose block size
    differs from the recording's (its block=, or ``block_size``: the command's --block-size) and
    takes the recorded pool gets that pool's memory, not its block count: "what if the blocks
    were 8 tokens" asks about the same KV memory, in finer blocks (a note says so)."""
    out, fallbacks, resized = [], {}, []
    for lane in lanes:
        kind, own = _read(lane.label)
        taken = () if kind else ("kind",)
        if kind is None:
            kind = "chunked" if {"budget", "prefix_cache"} & set(own) else rec.kind
        if kind == "continuous" and "kv" not in own and {"block_size", "kv_blocks"} & set(own):
            own["kv"] = "paged"  # its blocks say so
        paged = kind == "chunked" or own.get("kv", rec.fields.get("kv")) == "paged"
        sized = "kv_mib" in own  # its own KV budget sizes it
        wants = [
            k
            for k in TAKES[kind]
            if k not in own
            and not (sized and k in ("slots", "kv_blocks"))
            and (paged or k not in ("block_size", "kv_blocks"))
        ]
        taken += tuple(k for k in wants if k in rec.fields)
        fallbacks.update((k, rec.missing[k]) for k in wants if k in rec.missing)
        fields = {**{k: rec.fields[k] for k in taken if k != "kind"}, **own}
        size = fields.get("block_size") or block_size
        if "kv_blocks" in taken and rec.pool_tokens and size and size * fields["kv_blocks"] != rec.pool_tokens:
            fields["kv_blocks"] = -(-rec.pool_tokens // size)  # at least the recorded memory
            held = fields["kv_blocks"] * size
            resized.append(
                f"lane {lane.label!r} runs the recorded pool's {rec.pool_tokens:,} tokens in "
                f"{fields['kv_blocks']:,} blocks of {size}" + (f" ({held:,} tokens)" if held != rec.pool_tokens else "")
            )
        out.append(_checked(lane.label, kind, fields, taken))
    notes = [
        f"the recording does not say its {what}: lanes that do not set it use {default}"
        for what, default in fallbacks.values()
    ]
    return tuple(out), notes + resized


def check_pool_options_used(lanes: tuple[LaneSpec, ...], kv_blocks: int | None, block_size: int | None) -> None:
    """--kv-blocks and --block-size size the paged lanes' pools: with no paged lane (static
    batching, slot KV) they would be ignored, so LaneSpecError refuses them. Asked once the lanes'
    kinds are final (on a recording, after ``on_recording``)."""
    if any(lane.kind == "chunked" or lane.kv == "paged" for lane in lanes):
        return
    for flag, value in (("--kv-blocks", kv_blocks), ("--block-size", block_size)):
        if value is not None:
            raise LaneSpecError(
                f"{flag} sizes the paged lanes' KV pool, and no lane here is paged ("
                f"{', '.join(repr(lane.label) for lane in lanes)}: static batching and slot KV hold "
                f"--max-len tokens per row): drop it, or add a lane such as chunked or "
                f'"continuous kv=paged"'
            )


def check_memory_options(
    lanes: tuple[LaneSpec, ...], kv_memory_mib: float | None, kv_blocks: int | None, max_num_seqs: int | None
) -> None:
    """The race's --kv-memory / --kv-blocks / --max-num-seqs against its lanes (the app and
    ``tinyllm whatif`` both ask): LaneSpecError says which options clash. Whether a budget holds
    one request depends on the model's bytes per token: the engine says that (engine/build.py)."""
    if kv_memory_mib is not None and kv_blocks is not None:
        raise LaneSpecError("--kv-memory sizes every lane's KV: drop --kv-blocks")
    if max_num_seqs is not None and kv_memory_mib is None and not any(s.kv_mib is not None for s in lanes):
        raise LaneSpecError(
            "--max-num-seqs goes with --kv-memory (or a lane's kv_mib=): without a KV budget, "
            "--slots and a lane's slots= set its sequences"
        )
    for lane in lanes:
        if kv_memory_mib is not None and lane.kv_blocks is not None:
            raise LaneSpecError(f"lane {lane.label!r}: blocks= sizes the pool, and so does --kv-memory: give one")
