"""A recording's snapshot codec: each step's snapshot as what changed since the one before
(the record format is described in ``tinyllm.observe.recording``). ``SnapshotEncoder`` and
``SnapshotDecoder`` start from the same blank snapshot, built from the header, so the decoder
rebuilds every snapshot exactly."""

from __future__ import annotations

from dataclasses import asdict, fields, replace
from typing import Any

from tinyllm.observe.snapshot import Counters, EngineSnapshot, KVView, LifecycleEvent, RequestView
from tinyllm.request import Sampling

# Per-step fields get one-letter keys (a step's record is mostly these); see the module docstring.
_SLOT_KEYS = {"rid": "r", "context_len": "n", "blocks": "b", "just_admitted": "j", "prefill_left": "p"}
_SLOT_FIELDS = {v: k for k, v in _SLOT_KEYS.items()}
_REQ_FIELDS = tuple(f.name for f in fields(RequestView))
_KV_FIELDS = ("allocated_tokens", "used_tokens", "free_blocks", "cached_free_blocks")
_BLOCK_FIELDS = ("block_owner", "block_refs", "block_cached")
# The counters a delta carries as increments, in field order ("c"); speculation's ("sc": drafts,
# draft tokens, accepted tokens, then the accepted per position whole) only where it ran, so
# recordings made before speculation still read.
_COUNTER_FIELDS = tuple(f.name for f in fields(Counters) if not f.name.startswith("spec_"))
_SPEC_FIELDS = ("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens")


def blank_snapshot(header: dict) -> EngineSnapshot:
    """The engine before anything happened, from the header alone (both sides diff against it)."""
    e = header["engine"]
    k = e["kv"]
    n = k["n_blocks"] or 0
    flags = (False,) * n if k.get("cached_flags", True) else ()  # no prefix cache: no per-block flags
    kv = KVView.empty(
        k["kind"],
        k["reserved_tokens"],
        k["bytes_per_token"],
        block_size=k["block_size"],
        n_blocks=k["n_blocks"],
        free_blocks=n if k["kind"] == "paged" else None,
        block_owner=(None,) * n,
        block_refs=(0,) * n,
        block_cached=flags,
        cached_free_blocks=0,
        dtype=str(k.get("dtype", "")),
    )
    return EngineSnapshot.empty(
        kv,
        e["n_slots"],
        e["max_len"],
        max_batched_tokens=e["max_batched_tokens"],
        policy=e.get("policy", "fcfs"),
        speculative=e.get("speculative", 0),
        speculative_method=e.get("speculative_method", "ngram"),
    )


# -- events ---------------------------------------------------------------------------------------
def encode_event(ev: LifecycleEvent) -> list:
    return [ev.kind, ev.rid, ev.step, ev.time_s, ev.slot, ev.tokens, ev.reason, ev.cached]


def decode_event(row: list) -> LifecycleEvent:
    return LifecycleEvent(*row)


# -- snapshots --------------------------------------------------------------------------------------
def _request_full(v: RequestView) -> dict:
    d = {name: getattr(v, name) for name in _REQ_FIELDS}
    d["sampling"] = asdict(v.sampling)
    return d


class SnapshotEncoder:
    """Turns each new snapshot into what changed since the previous one."""

    def __init__(self, header: dict):
        self._prev = blank_snapshot(header)
        self._views: dict[int, RequestView] = {}

    def encode(self, snap: EngineSnapshot) -> dict:
        prev, d = self._prev, {}
        if snap.time_s != prev.time_s:
            d["t"] = snap.time_s
        reqs, grew = {}, {}
        for v in snap.requests:
            old = self._views.get(v.rid)
            if old is v:  # the engine reuses a view until it changes
                continue
            if old is None:
                reqs[v.rid] = _request_full(v)
            else:
                reqs[v.rid] = delta = self._request_delta(old, v)
                if isinstance(delta, list):
                    grew[v.rid] = len(delta)
            self._views[v.rid] = v
        if len(self._views) > len(snap.requests):  # the engine forgot some (forget_ended)
            for rid in self._views.keys() - {v.rid for v in snap.requests}:
                reqs[rid] = None
                del self._views[rid]
        slots = {}
        for old, new in zip(prev.slots, snap.slots):
            g = grew.get(new.rid) if new.rid == old.rid else None
            if old != new or g is not None:
                fs = {k: getattr(new, f) for f, k in _SLOT_KEYS.items() if getattr(old, f) != getattr(new, f)}
                if g is not None:  # its request got g tokens and nothing else:
                    if new.context_len == old.context_len + g:
                        fs.pop("n", None)  # the decoder grows the slot by as many
                    else:
                        fs["n"] = new.context_len  # said, even when unchanged
                if fs:
                    slots[new.slot] = fs
        if slots:
            d["s"] = slots
        if reqs:
            d["r"] = reqs
        if snap.queue != prev.queue:
            d["q"] = _queue_delta(prev.queue, snap.queue)
        kv = {f: getattr(snap.kv, f) for f in _KV_FIELDS if getattr(snap.kv, f) != getattr(prev.kv, f)}
        now, was = [getattr(snap.kv, f) for f in _BLOCK_FIELDS], [getattr(prev.kv, f) for f in _BLOCK_FIELDS]
        if now != was:
            if len({len(t) for t in now + was}) == 1:  # the usual case: a few blocks changed hands
                kv["blocks"] = [[i, *new] for i, (new, old) in enumerate(zip(zip(*now), zip(*was))) if new != old]
            else:  # e.g. no prefix cache: no per-block flags at all
                kv.update(zip(_BLOCK_FIELDS, now))
        if kv:
            d["kv"] = kv
        if snap.batch != prev.batch:
            d["bt"] = [list(item) for item in snap.batch]
        if snap.speculative_off != prev.speculative_off:
            d["so"] = snap.speculative_off
        if snap.speculative_error != prev.speculative_error:
            d["se"] = snap.speculative_error
        if snap.counters != prev.counters:  # increments, in field order: short
            d["c"] = [getattr(snap.counters, f) - getattr(prev.counters, f) for f in _COUNTER_FIELDS]
            if snap.counters.spec_drafts != prev.counters.spec_drafts:
                d["sc"] = [getattr(snap.counters, f) - getattr(prev.counters, f) for f in _SPEC_FIELDS]
                d["sc"].append(list(snap.counters.spec_accepted_per_pos))
        self._prev = snap
        return d

    @staticmethod
    def _request_delta(old: RequestView, v: RequestView) -> dict | list:
        """The changed fields; just a list of tokens when new tokens are all that changed."""
        d = {
            f: getattr(v, f)
            for f in _REQ_FIELDS
            if f not in ("tokens", "prompt", "sampling") and getattr(old, f) != getattr(v, f)
        }
        if v.tokens != old.tokens:
            if v.tokens[: len(old.tokens)] == old.tokens:
                if not d:
                    return list(v.tokens[len(old.tokens) :])
                d["+"] = v.tokens[len(old.tokens) :]
            else:
                d["tokens"] = v.tokens
        return d


class SnapshotDecoder:
    """Applies the encoder's deltas, in order, to rebuild each snapshot."""

    def __init__(self, header: dict, start: EngineSnapshot | None = None):
        self.snapshot = start if start is not None else blank_snapshot(header)
        self._views = {v.rid: v for v in self.snapshot.requests}

    def apply(self, d: dict) -> EngineSnapshot:
        s = self.snapshot
        changes: dict[str, Any] = {}
        if "t" in d:
            changes["time_s"] = float(d["t"])
        grew: dict[int, int] = {}
        if "r" in d:
            for rid, fs in d["r"].items():
                rid = int(rid)
                old = self._views.get(rid)
                if fs is None:
                    self._views.pop(rid, None)
                elif isinstance(fs, list):  # new tokens only
                    self._views[rid] = replace(old, tokens=old.tokens + tuple(fs))
                    grew[rid] = len(fs)
                else:
                    self._views[rid] = self._request(fs) if old is None else self._request_update(old, fs)
            changes["requests"] = tuple(self._views[r] for r in sorted(self._views))
        if "s" in d or grew:
            slots = list(s.slots)
            for i, fs in d.get("s", {}).items():
                fs = {_SLOT_FIELDS[k]: v for k, v in fs.items()}
                if "blocks" in fs:
                    fs["blocks"] = tuple(fs["blocks"])
                slots[int(i)] = replace(slots[int(i)], **fs)
            explicit = {int(i) for i, fs in d.get("s", {}).items() if "n" in fs or "r" in fs}
            for i, sv in enumerate(slots):
                if sv.rid in grew and i not in explicit:
                    slots[i] = replace(sv, context_len=sv.context_len + grew[sv.rid])
            changes["slots"] = tuple(slots)
        if "q" in d:
            changes["queue"] = _apply_queue(s.queue, d["q"])
        if "kv" in d:
            kv = {k: tuple(v) if k in _BLOCK_FIELDS else v for k, v in d["kv"].items()}
            blocks = kv.pop("blocks", None)
            if blocks is not None:
                base = replace(s.kv, **kv)
                owner, refs, cached = list(base.block_owner), list(base.block_refs), list(base.block_cached)
                for i, o, r, c in blocks:
                    owner[i], refs[i], cached[i] = o, r, c
                kv.update(block_owner=tuple(owner), block_refs=tuple(refs), block_cached=tuple(cached))
            changes["kv"] = replace(s.kv, **kv)
        if "bt" in d:
            changes["batch"] = tuple((int(rid), int(n)) for rid, n in d["bt"])
        if "so" in d:
            changes["speculative_off"] = bool(d["so"])
        if "se" in d:
            changes["speculative_error"] = str(d["se"])
        if "c" in d:
            if len(d["c"]) != len(_COUNTER_FIELDS):
                raise ValueError(f"counters: expected {len(_COUNTER_FIELDS)} increments, got {len(d['c'])}")
            changes["counters"] = replace(
                s.counters, **{f: getattr(s.counters, f) + inc for f, inc in zip(_COUNTER_FIELDS, d["c"])}
            )
            if "sc" in d:
                *incs, per_pos = d["sc"]
                spec = {f: getattr(s.counters, f) + inc for f, inc in zip(_SPEC_FIELDS, incs)}
                changes["counters"] = replace(changes["counters"], **spec, spec_accepted_per_pos=tuple(per_pos))
        if changes:
            self.snapshot = replace(s, **changes)
        return self.snapshot

    @staticmethod
    def _request(fs: dict) -> RequestView:
        fs = dict(fs, prompt=tuple(fs["prompt"]), tokens=tuple(fs["tokens"]), sampling=Sampling(**fs["sampling"]))
        return RequestView(**fs)

    @staticmethod
    def _request_update(old: RequestView, fs: dict) -> RequestView:
        fs = dict(fs)
        if "+" in fs:
            fs["tokens"] = old.tokens + tuple(fs.pop("+"))
        elif "tokens" in fs:
            fs["tokens"] = tuple(fs["tokens"])
        return replace(old, **fs)


def _queue_delta(old: tuple[int, ...], new: tuple[int, ...]) -> list | dict:
    """A long queue changes at its ends: [dropped from the front, appended ids]; else the whole."""
    for k in range(len(old) + 1):
        tail = old[k:]
        if new[: len(tail)] == tail:
            return [k, list(new[len(tail) :])] if k or len(tail) else {"all": list(new)}
        if k > 8:
            break
    return {"all": list(new)}


def _apply_queue(old: tuple[int, ...], q) -> tuple[int, ...]:
    if isinstance(q, dict):
        return tuple(q["all"])
    k, added = q
    return old[k:] + tuple(added)
