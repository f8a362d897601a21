"""A run, written as it happens: JSON lines a replay (or a trace export) reads back, with no model.

    line 1      header: format, version, model, tokenizer, the engine's fixed settings
    line 2..    one record per change: {"step": N, "snap": <what changed in the snapshot>,
                "life": [<lifecycle events>], "text": {rid: <text appended>},
                "prompt": {rid: <prompt text>}, "x": {<the viewer's own fields>},
                "slo": {rid: <its workload line's own SLO, when submitted>},
                "verdict": {rid: <its outcome against its SLO, when it ended>}}
    The header's "slo" (when the run had --slo) is the run's SLO; a request's own wins over it.
    The header's "text": false (tinyllm serve --record without --record-text): no "prompt" or
    "text" records, and token ids scrambled by a permutation not stored (lengths and shared
    prefixes kept): replays show lengths, what-ifs run the same shapes.
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
few MB. ``SnapshotEncoder`` and ``SnapshotDecoder`` (``tinyllm.observe.deltas``, re-exported
here) start from the same blank snapshot (built from the header), so the decoder rebuilds every
snapshot exactly (floats survive JSON as repr).

No torch and no textual: the engine side writes, the app and ``tinyllm trace`` read.
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import Any, TextIO

from tinyllm.observe.deltas import SnapshotDecoder as SnapshotDecoder
from tinyllm.observe.deltas import SnapshotEncoder as SnapshotEncoder
from tinyllm.observe.deltas import blank_snapshot as blank_snapshot
from tinyllm.observe.deltas import decode_event as decode_event
from tinyllm.observe.deltas import encode_event as encode_event
from tinyllm.observe.snapshot import EngineSnapshot
from tinyllm.slo import SLO, SLOVerdict, verdict_from_record

FORMAT = "tinyllm-recording"
VERSION = 1
FLUSH_S = 0.5  # flushed this often while writing, and whenever the run goes idle


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
            "speculative": snap.speculative,
            "speculative_method": snap.speculative_method,
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


_LINE_BREAKS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_ESCAPE_LINE_BREAKS = str.maketrans(_LINE_BREAKS)


def json_line(obj) -> str:
    """``obj`` as one line of JSON (no newline): compact, text kept as UTF-8, but the characters
    other line readers break lines at (U+0085, U+2028, U+2029: httpx's iter_lines, str.splitlines)
    escaped, so a prompt holding one cannot split a record (it broke every viewer's stream)."""
    s = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return s.translate(_ESCAPE_LINE_BREAKS) if any(c in s for c in _LINE_BREAKS) else s  # (rare: scan, then fix)


class RecordingWriter:
    """Streams records to a file (bounded memory: nothing is kept), flushed every FLUSH_S."""

    def __init__(self, path: str | Path, header: dict):
        self.path = Path(path)
        self._f: TextIO = open_text(self.path, "w")
        self._f.write(json_line(header) + "\n")
        self._f.flush()
        self._flushed = time.monotonic()
        self.records = 0

    def write(self, record: dict) -> None:
        self._f.write(json_line(record) + "\n")
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
