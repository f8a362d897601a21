"""A race lane's settings as the user writes them: ``--lanes fcfs priority "fair budget=64"``.

A lane is one engine with its own settings. Each lane is one argument: words separated by
spaces or commas, each either a bare word (a lane kind: ``static``, ``continuous``, ``chunked``;
or a scheduling policy, meaning a token-budget lane with that policy) or ``key=value``:

    policy=fcfs|priority|shortest-first|fair   budget=N (tokens per step)   slots=N
    block=N (tokens per KV block)   blocks=N (KV pool size)   prefix=on|off   chunked=on|off
    kv=slots|paged (a continuous lane's cache)

A single argument made only of bare words separated by commas is a list of lanes, one per
word (``--lanes static,chunked``, the race's original form). No torch: the app checks lanes
before the engine process starts, so a typo is a one-line error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tinyllm.request import SCHEDULING_POLICIES

KINDS = ("static", "continuous", "chunked")
KEYS = ("policy", "budget", "slots", "block", "blocks", "prefix", "chunked", "kv")
DEFAULT_LANES = KINDS


class LaneSpecError(ValueError):
    """A lane that cannot be built, in the user's words: which lane, which setting, what is allowed."""


@dataclass(frozen=True)
class LaneSpec:
    label: str                            # the lane's name on screen: what the user wrote
    kind: str = "chunked"                 # one of KINDS
    policy: str = "fcfs"
    budget: int | None = None             # None: the race's default
    slots: int | None = None
    block_size: int | None = None
    kv_blocks: int | None = None
    prefix_cache: bool | None = None      # None: on for a chunked lane
    kv: str | None = None                 # continuous lanes: "slots" (default) or "paged"

    def describe(self) -> str:
        """Every setting that differs from the race's defaults, for the lane's subtitle."""
        parts = [f"policy {self.policy}"] if self.policy != "fcfs" else []
        for name, v in (("budget", self.budget), ("slots", self.slots), ("block", self.block_size),
                        ("blocks", self.kv_blocks), ("kv", self.kv)):
            if v is not None:
                parts.append(f"{name} {v}")
        if self.prefix_cache is not None:
            parts.append(f"prefix cache {'on' if self.prefix_cache else 'off'}")
        return ", ".join(parts)


def _int(lane: str, key: str, v: str) -> int:
    if not re.fullmatch(r"[0-9]+", v) or int(v) < 1:
        raise LaneSpecError(f"lane {lane!r}: {key} must be an integer >= 1, got {v!r}")
    return int(v)


def _switch(lane: str, key: str, v: str) -> bool:
    if v not in ("on", "off"):
        raise LaneSpecError(f"lane {lane!r}: {key} must be on or off, got {v!r}")
    return v == "on"


def parse_lane(text: str) -> LaneSpec:
    """One lane from its argument (see the module docstring); LaneSpecError says what is wrong."""
    label = " ".join(text.replace(",", " ").split())
    if not label:
        raise LaneSpecError("an empty lane: give a lane kind, a policy, or key=value settings")
    kind, fields = None, {}
    for word in label.split():
        key, eq, v = word.partition("=")
        if not eq:
            if word in KINDS:
                kind = word
            elif word in SCHEDULING_POLICIES:
                fields["policy"] = word
            else:
                raise LaneSpecError(f"lane {label!r}: {word!r} is neither a lane kind ({', '.join(KINDS)}) nor a "
                                    f"policy ({', '.join(SCHEDULING_POLICIES)}); settings are key=value with key one "
                                    f"of {', '.join(KEYS)}")
        elif key == "policy":
            if v not in SCHEDULING_POLICIES:
                raise LaneSpecError(f"lane {label!r}: policy must be one of {', '.join(SCHEDULING_POLICIES)}, got {v!r}")
            fields["policy"] = v
        elif key in ("budget", "slots", "blocks", "block"):
            fields[{"block": "block_size", "blocks": "kv_blocks"}.get(key, key)] = _int(label, key, v)
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
    kind = kind or "chunked"
    if kind == "static" and set(fields) - {"slots"}:
        raise LaneSpecError(f"lane {label!r}: static batching takes only slots= (its batch size)")
    if kind == "chunked" and fields.get("kv") == "slots":
        raise LaneSpecError(f"lane {label!r}: a chunked (token-budget) lane needs the paged KV cache")
    if kind == "continuous" and (fields.get("budget") or fields.get("prefix_cache")):
        raise LaneSpecError(f"lane {label!r}: budget and prefix need chunked prefill (chunked=on)")
    if kind == "continuous" and fields.get("kv") != "paged" and ("block_size" in fields or "kv_blocks" in fields):
        raise LaneSpecError(f"lane {label!r}: block and blocks need the paged KV cache (kv=paged)")
    return LaneSpec(label, kind, **fields)


def parse_lanes(args: list[str] | tuple[str, ...] | None) -> tuple[LaneSpec, ...]:
    """Every lane, in the order given (None: the three default lanes). At least one; labels unique."""
    if not args:
        return tuple(LaneSpec(k, k) for k in DEFAULT_LANES)
    if len(args) == 1 and "," in args[0] and "=" not in args[0]:
        args = [w for w in args[0].split(",") if w.strip()]            # the old form: a list of lanes
    lanes = tuple(parse_lane(a) for a in args)
    seen: set[str] = set()
    for lane in lanes:
        if lane.label in seen:
            raise LaneSpecError(f"two lanes are both {lane.label!r}: give each lane different settings")
        seen.add(lane.label)
    return lanes
