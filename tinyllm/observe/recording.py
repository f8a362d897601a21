"""A run, written as it happens: JSON lines a replay (or a trace export) reads back, with no model.

    line 1      header: format, version, model, tokenizer, the engine's fixed settings
    line 2..    one record per change: {"step": N, "snap": <what changed in the snapshot>,
                "life": [<lifecycle events>], "text": {rid: <text appended>},
                "prompt": {rid: <prompt text>}, "x": {<the viewer's own fields>},
                "slo": {rid: <its workload line's own SLO, when submitted>},
                "verdict": {rid: <its outcome against its SLO, when it ended>}}
    The header's "slo" (when the run had --slo) is the run's SLO; a request's own wins over it.
    A verdict: {"outcome": met | missed | aborted | failed, "slo": the SLO it was judged
    against, "missed": [ttft, tpot] (a miss), "reason": the WAIT_REASONS code it waited most}.
    Recordings made before SLOs were recorded have none of these: they read as runs without one.

    "snap" keys: "t" engine clock; "s" slots {slot: {"r" rid, "n" context_len, "b" blocks,
                 "j" just_admitted, "p" prefill_left}}; "r" requests {rid: a whole RequestView
                 when new, else its changed fields, "+" = tokens appended; only a list: tokens
                 appended and nothing else (its slot's "n" then grows by as many, unless given)};
                 null: the engine forgot it (an ended request, see forget_ended)};
                 "q" queue: [dropped from the front, [appended]] or {"all": [the whole queue]};
                 "kv" {changed KVView fields, "blocks": [[block, owner, refs, cached]]};
                 "bt" the step's batch [[rid, tokens computed]] (when it changed);
                 "c" counter increments in Counters' field order.
    A file whose name ends in ".gz" is gzip-compressed (about 8x smaller).

Why deltas: a full snapshot per step (every request's tokens, every block's owner) would be
megabytes per hundred steps. A record carries only what changed: a request's new tokens, the
slots and blocks that moved, the counters that ticked, so 10,000 steps with 500 requests stay a
few MB. ``SnapshotEncoder`` and ``SnapshotDecoder`` start from the same blank snapshot (built
from the header), so the decoder rebuilds every snapshot exactly (floats survive JSON as repr).

No torch and no textual: the engine side writes, the app and ``tinyllm trace`` read.
"""

from __future__ import annotations

import gzip
import json
import time
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any, TextIO

from tinyllm.observe.snapshot import Counters, EngineSnapshot, KVView, LifecycleEvent, RequestView, SlotView
from tinyllm.request import Sampling
from tinyllm.slo import SLO, SLOVerdict, verdict_from_record

FORMAT = "tinyllm-recording"
VERSION = 1
FLUSH_S = 0.5  # flushed this often while writing, and whenever the run goes idle

# Per-step fields get one-letter keys (a step's record is mostly these); see the module docstring.
_SLOT_KEYS = {"rid": "r", "context_len": "n", "blocks": "b", "just_admitted": "j", "prefill_left": "p"}
_SLOT_FIELDS = {v: k for k, v in _SLOT_KEYS.items()}
_REQ_FIELDS = tuple(f.name for f in fields(RequestView))
_KV_FIELDS = ("allocated_tokens", "used_tokens", "free_blocks", "cached_free_blocks")
_BLOCK_FIELDS = ("block_owner", "block_refs", "block_cached")
_COUNTER_FIELDS = tuple(f.name for f in fields(Counters))


class RecordingError(ValueError):
    """A recording that cannot be read: the message starts with ``file:line:``."""


# What applying a malformed record can raise (a decoder fed JSON it did not write).
BAD_RECORD = (KeyError, TypeError, ValueError, IndexError, AttributeError)


# -- the fixed part: the header ------------------------------------------------------------------
def make_header(
    snap: EngineSnapshot, model: str, tokenizer: str, settings: dict[str, Any], slo: SLO | None = None
) -> dict:
    """The header line. ``settings``: the engine's options as the user gave them (for people);
    the ``engine`` part is what the decoder needs to rebuild snapshots; ``slo`` the run's --slo
    (what a replay without --slo judges by)."""
    kv = snap.kv
    header = {
        "format": FORMAT,
        "version": VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": model,
        "tokenizer": tokenizer,
        "settings": settings,
        "engine": {
            "n_slots": snap.n_slots,
            "max_len": snap.max_len,
            "max_batched_tokens": snap.max_batched_tokens,
            "policy": snap.policy,
            "kv": {
                "kind": kv.kind,
                "reserved_tokens": kv.reserved_tokens,
                "bytes_per_token": kv.bytes_per_token,
                "block_size": kv.block_size,
                "n_blocks": kv.n_blocks,
                "cached_flags": bool(kv.block_cached),
                "dtype": kv.dtype,
            },
        },
    }
    if slo is not None:
        header["slo"] = str(slo)
    return header


def header_slo(header: dict) -> SLO | None:
    """The run's SLO a recording's header names (None: the run had none, or predates SLOs)."""
    text = header.get("slo")
    return None if text is None else SLO.parse(text)


def recorded_slos(records: list[dict]) -> dict[int, SLO]:
    """Each request's own SLO (its workload line's), by request id, from a recording's records."""
    return {int(rid): SLO.parse(text) for rec in records for rid, text in (rec.get("slo") or {}).items()}


def recorded_verdicts(records: list[dict]) -> dict[int, tuple[SLOVerdict, SLO]]:
    """Each ended request's verdict and the SLO it was judged against, by request id ({} for a
    recording made without an SLO, or before they were recorded)."""
    return {int(rid): verdict_from_record(d) for rec in records for rid, d in (rec.get("verdict") or {}).items()}


def check_header(header, where: str) -> None:
    """Raise RecordingError ("WHERE: ...") unless ``header`` starts a recording this code reads."""
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise RecordingError(
            f"{where}: not a tinyllm recording (its first line must be a header with "
            f'"format": "{FORMAT}"; record one with tinyllm-tui --record FILE)'
        )
    version = header.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise RecordingError(
            f"{where}: this recording has format version {version}, newer than this "
            f"tinyllm reads (up to {VERSION}); replay it with a newer tinyllm"
        )
    try:
        blank_snapshot(header)
    except BAD_RECORD as e:
        raise RecordingError(
            f'{where}: the header\'s "engine" settings are incomplete ({type(e).__name__}: {e})'
        ) from None
    try:
        header_slo(header)
    except ValueError as e:
        raise RecordingError(f'{where}: the header\'s "slo" is not an SLO ({e})') from None


def blank_snapshot(header: dict) -> EngineSnapshot:
    """The engine before anything happened, from the header alone (both sides diff against it)."""
    e = header["engine"]
    k = e["kv"]
    n = k["n_blocks"] or 0
    flags = (False,) * n if k.get("cached_flags", True) else ()  # no prefix cache: no per-block flags
    kv = KVView(
        k["kind"],
        k["reserved_tokens"],
        0,
        0,
        k["bytes_per_token"],
        k["block_size"],
        k["n_blocks"],
        n if k["kind"] == "paged" else None,
        (None,) * n,
        (0,) * n,
        flags,
        0,
        str(k.get("dtype", "")),
    )
    slots = tuple(SlotView(i, None, 0, e["max_len"]) for i in range(e["n_slots"]))
    return EngineSnapshot(
        0.0, e["n_slots"], e["max_len"], slots, (), (), kv, Counters(), e["max_batched_tokens"], e.get("policy", "fcfs")
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
        if snap.counters != prev.counters:  # increments, in field order: short
            d["c"] = [getattr(snap.counters, f) - getattr(prev.counters, f) for f in _COUNTER_FIELDS]
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
        if "c" in d:
            if len(d["c"]) != len(_COUNTER_FIELDS):
                raise ValueError(f"counters: expected {len(_COUNTER_FIELDS)} increments, got {len(d['c'])}")
            changes["counters"] = replace(
                s.counters, **{f: getattr(s.counters, f) + inc for f, inc in zip(_COUNTER_FIELDS, d["c"])}
            )
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


# -- files ------------------------------------------------------------------------------------------
def open_text(path: Path, mode: str) -> TextIO:
    """A text file, gzip-compressed when its name ends in .gz (recordings, and the reports and
    traces the commands write)."""
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def write_text(path: str | Path, text: str) -> None:
    """A report or trace a command was asked for, compressed when its name ends in .gz."""
    with open_text(Path(path), "w") as f:
        f.write(text)


def _dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


class RecordingWriter:
    """Streams records to a file (bounded memory: nothing is kept), flushed every FLUSH_S."""

    def __init__(self, path: str | Path, header: dict):
        self.path = Path(path)
        self._f: TextIO = open_text(self.path, "w")
        self._f.write(_dumps(header) + "\n")
        self._f.flush()
        self._flushed = time.monotonic()
        self.records = 0

    def write(self, record: dict) -> None:
        self._f.write(_dumps(record) + "\n")
        self.records += 1
        if time.monotonic() - self._flushed >= FLUSH_S:
            self._f.flush()
            self._flushed = time.monotonic()

    def flush(self) -> None:
        if not self._f.closed:
            self._f.flush()
            self._flushed = time.monotonic()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


def read_recording(path: str | Path) -> tuple[dict, list[tuple[int, dict]], str | None]:
    """(header, [(line number, record)], warning). Raises RecordingError ("file:line: what")
    for a file that is not a recording, of a newer format, or broken in the middle. A last line
    cut off mid-write (the run was killed) is dropped with a warning instead: what came before
    it is a good recording."""
    path = Path(path)
    lines: list[str] = []
    cut_off = False
    try:
        with open_text(path, "r") as f:
            try:
                for line in f:
                    lines.append(line)
            except EOFError:  # a .gz cut off mid-write: keep what came before
                cut_off = True
    except gzip.BadGzipFile:
        raise RecordingError(f"{path}: not gzip-compressed, though its name ends in .gz") from None
    except OSError as e:
        raise RecordingError(f"{path}: cannot read it: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise RecordingError(f"{path}: not a tinyllm recording (not UTF-8 text: {e.reason})") from None
    cut_off = cut_off or bool(lines) and not lines[-1].endswith("\n")  # the last line was being written
    if not lines:
        raise RecordingError(f"{path}:1: empty file, not a tinyllm recording")
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError:
        header = None
    check_header(header, f"{path}:1")
    records, warning = [], None
    for n, line in enumerate(lines[1:], start=2):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if cut_off and n == len(lines):
                warning = (
                    f"{path}:{n}: the last record is cut off (the recording was interrupted); "
                    f"replaying the {len(records)} records before it"
                )
                break
            raise RecordingError(f"{path}:{n}: broken record ({e.msg} at column {e.colno})") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
            raise RecordingError(f'{path}:{n}: a record must be a JSON object with an integer "step"')
        try:
            recorded_slos([rec])  # (checked here: file:line for a bad one)
            recorded_verdicts([rec])
        except (ValueError, TypeError, AttributeError) as e:
            raise RecordingError(f"{path}:{n}: a bad SLO or verdict ({e})") from None
        records.append((n, rec))
    return header, records, warning
