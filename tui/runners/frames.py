"""The app's frames, recorded and rebuilt: what ``--record`` writes and ``--replay`` reads.

``tinyllm.observe.recording`` holds the file format and the snapshot deltas; this module adds what only
the app shows (the event log, request texts and prompts, pause and speed, tokens/s), in the
record's ``"x"`` part, and the request tracks of the timeline (rebuilt from the lifecycle
events, so they cost nothing in the file). ``FrameRecorder`` is the writing side (in the
runner's thread), ``FrameBuilder`` the reading side (in the replay runner and the attach
runner, whose server stream is a recording). ``FrameDiffer`` / ``FrameMerger`` are the engine
child process's pipe: the child sends what changed, the app rebuilds whole frames.
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import replace
from pathlib import Path

from tinyllm.observe.recording import (
    RecordingWriter,
    SnapshotDecoder,
    SnapshotEncoder,
    decode_event,
    encode_event,
    make_header,
)
from tinyllm.observe.snapshot import EngineSnapshot, LifecycleEvent
from tinyllm.observe.timeline import Timeline
from tinyllm.observe.verdicts import VerdictJudge
from tinyllm.slo import SLO
from tinyllm.units import count
from tui.runners.interface import LOG_LINES, Frame, LogEntry, lifecycle_log
from tui.runners.rate import TokenRate


def tokenizer_id(model_dir: str | Path) -> str:
    """A short fingerprint of the checkpoint's tokenizer.json: a replay's texts came from it."""
    p = Path(model_dir) / "tokenizer.json"
    try:
        return "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    except OSError:
        return "unknown"


class FrameRecorder:
    """Writes one record per change of what the app would show (nothing while nothing changes).
    With an SLO (``slo``: the run's --slo; a request's own, given to ``record``), each request's
    verdict goes in when it ends, so a trace or a what-if reads it without judging again."""

    def __init__(
        self,
        path: str | Path,
        snap: EngineSnapshot,
        model: str,
        model_dir: str | Path,
        settings: dict,
        slo: SLO | None = None,
    ):
        header = make_header(snap, model, tokenizer_id(model_dir), settings, slo)
        self.slo = slo
        self._judge = VerdictJudge(slo)  # (its own: the requests' own SLOs, as written)
        self._writer = RecordingWriter(path, header)
        self._enc = SnapshotEncoder(header)
        self._snap: EngineSnapshot | None = None
        self._text_len: dict[int, int] = {}
        self._log_seq = 0
        self._x: dict = {}

    @property
    def path(self) -> Path:
        return self._writer.path

    def record(
        self,
        step: int,
        snap: EngineSnapshot,
        events: list[LifecycleEvent],
        prompts: dict[int, str],
        texts: dict[int, str],
        log: deque[LogEntry],
        x: dict,
        slos: dict[int, SLO] | None = None,
    ) -> None:
        """``slos``: request id -> its workload line's own SLO (written once, when first given)."""
        rec: dict = {"step": step}
        if snap is not self._snap:
            d = self._enc.encode(snap)
            if d:
                rec["snap"] = d
            self._snap = snap
        for rid, slo in (slos or {}).items():
            if rid not in self._judge.own:
                self._judge.own[rid] = slo
                rec.setdefault("slo", {})[rid] = str(slo)
        if events:
            rec["life"] = [encode_event(e) for e in events]
            verdicts = self._judge.judge(snap, events)
            if verdicts:
                rec["verdict"] = verdicts
        for rid, t in texts.items():
            n = self._text_len.get(rid)
            if n is None:
                rec.setdefault("prompt", {})[rid] = prompts.get(rid, "")
                n = 0
            if len(t) != n:
                rec.setdefault("text", {})[rid] = t[n:]
                self._text_len[rid] = len(t)
            elif rid not in self._text_len:
                self._text_len[rid] = 0
        new_log = [e for e in log if e.seq > self._log_seq] if log and log[-1].seq > self._log_seq else []
        changed = {k: v for k, v in x.items() if self._x.get(k) != v}
        if new_log:
            self._log_seq = new_log[-1].seq
            changed["log"] = [[e.seq, e.step, e.time_s, e.kind, e.text, e.rid, e.slot] for e in new_log]
        if len(rec) == 1 and not changed:
            return  # nothing a viewer would see
        self._x.update((k, v) for k, v in x.items())
        if changed:
            rec["x"] = changed
        self._writer.write(rec)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class FrameBuilder:
    """Rebuilds the app's frames from records, in order. ``copy()`` makes a keyframe to seek from."""

    def __init__(self, header: dict, log_events: bool = False):
        self.header = header
        self.log_events = log_events  # no recorded log (a server's stream): write it from the events
        self._dec = SnapshotDecoder(header)
        self.texts: dict[int, str] = {}
        self.prompts: dict[int, str] = {}
        self.log: deque[LogEntry] = deque(maxlen=LOG_LINES)
        self.timeline = Timeline()
        self.x: dict = {"paused": False, "delay": 0, "pending": 0, "step_ms": None, "steps_behind": 0}
        self.rate = TokenRate()  # (derived: not in the file)
        self.slos: dict[int, SLO] = {}  # requests' own SLOs (workload lines')
        self.step = 0

    @property
    def snapshot(self) -> EngineSnapshot:
        return self._dec.snapshot

    def apply(self, rec: dict) -> None:
        self.step = rec["step"]
        if "snap" in rec:
            self._dec.apply(rec["snap"])
            for rid, fs in rec["snap"].get("r", {}).items():
                if fs is None:  # the engine forgot it: so do we
                    self.texts.pop(int(rid), None)
                    self.prompts.pop(int(rid), None)
                    self.timeline.forget(int(rid))
                    self.slos.pop(int(rid), None)
        for rid, text in rec.get("slo", {}).items():
            self.slos[int(rid)] = SLO.parse(text)
        for rid, p in rec.get("prompt", {}).items():
            self.prompts[int(rid)] = p
            self.texts.setdefault(int(rid), "")
        for rid, t in rec.get("text", {}).items():
            self.texts[int(rid)] = self.texts.get(int(rid), "") + t
        if "life" in rec:
            events = [decode_event(row) for row in rec["life"]]
            self.timeline.feed(events)
            if self.log_events:
                self._log_from(events)
        if "snap" in rec:
            self.timeline.note_drafts(self.snapshot)
        x = rec.get("x")
        if x:
            for row in x.get("log", ()):
                self.log.append(LogEntry(*row))
            self.x.update((k, v) for k, v in x.items() if k != "log")
        self.rate.update(self.snapshot)

    def _log_from(self, events: list[LifecycleEvent]) -> None:
        for ev in events:
            said = (
                ("submit", f"#{ev.rid} queued ({count(ev.tokens, 'prompt token')})")
                if ev.kind == "queued"
                else lifecycle_log(ev)
            )
            if said is not None:
                seq = self.log[-1].seq + 1 if self.log else 1
                kind, text = said
                self.log.append(
                    LogEntry(seq=seq, step=ev.step, time_s=ev.time_s, kind=kind, text=text, rid=ev.rid, slot=ev.slot)
                )

    def frame(self, seq: int, paused: bool, delay_ms: int) -> Frame:
        x = self.x
        return Frame(
            seq=seq,
            snapshot=self.snapshot,
            prompts=dict(self.prompts),
            texts=dict(self.texts),
            log=tuple(self.log),
            paused=paused,
            step_delay_ms=delay_ms,
            pending_arrivals=int(x.get("pending", 0)),
            tokens_per_s=self.rate.tps,
            tps_history=tuple(self.rate.history),
            step_ms=None if x.get("step_ms") is None else float(x["step_ms"]),  # (a server's stream has none)
            steps_done=self.step - int(x.get("steps_behind", 0)),
            status="ready",
            tracks=self.timeline.tracks(),
            slos=dict(self.slos),
        )

    def copy(self) -> FrameBuilder:
        b = FrameBuilder.__new__(FrameBuilder)
        b.__dict__.update(self.__dict__)
        b._dec = SnapshotDecoder(self.header, self._dec.snapshot)
        b.texts, b.prompts, b.x, b.slos = dict(self.texts), dict(self.prompts), dict(self.x), dict(self.slos)
        b.log = deque(self.log, maxlen=LOG_LINES)
        b.rate = self.rate.copy()
        b.timeline = Timeline()
        b.timeline._tracks = dict(self.timeline._tracks)
        return b


def settings_of(spec) -> dict:
    """The engine settings for a recording's header: an EngineSpec's checkpoint and config as plain
    values (its SLO is the header's own)."""
    return {"model_dir": spec.model_dir, **spec.config.as_dict()}


# -- the child's pipe: the child sends what changed, the parent rebuilds whole frames ---------------
class FrameDiffer:
    """Child side: strip a Frame down to what changed since the last one sent."""

    def __init__(self):
        self._views: dict[int, object] = {}
        self._tracks: dict[int, object] = {}
        self._texts: dict[int, str] = {}
        self._prompts: set[int] = set()
        self._slos: set[int] = set()
        self._log_seq = 0

    def delta(self, f: Frame) -> Frame:
        # The engine reuses a request's view object until the request changes, and the timeline
        # its tracks: identity is enough.
        views = tuple(v for v in f.snapshot.requests if self._views.get(v.rid) is not v)
        self._views.update((v.rid, v) for v in views)
        tracks = tuple(t for t in f.tracks if self._tracks.get(t.rid) is not t)
        self._tracks.update((t.rid, t) for t in tracks)
        texts = {rid: t for rid, t in f.texts.items() if self._texts.get(rid) != t}
        self._texts.update(texts)
        prompts = {rid: p for rid, p in f.prompts.items() if rid not in self._prompts}
        self._prompts.update(prompts)
        slos = {rid: s for rid, s in f.slos.items() if rid not in self._slos}
        self._slos.update(slos)
        log = tuple(e for e in f.log if e.seq > self._log_seq)
        if log:
            self._log_seq = log[-1].seq
        return replace(
            f,
            snapshot=replace(f.snapshot, requests=views),
            texts=texts,
            prompts=prompts,
            log=log,
            tracks=tracks,
            slos=slos,
        )


class FrameMerger:
    """Parent side: apply deltas, return whole immutable frames."""

    def __init__(self):
        self._views: dict[int, object] = {}  # insertion order = request id order
        self._tracks: dict[int, object] = {}
        self._texts: dict[int, str] = {}
        self._prompts: dict[int, str] = {}
        self._slos: dict[int, SLO] = {}
        self._log: deque[LogEntry] = deque(maxlen=LOG_LINES)

    def merge(self, d: Frame) -> Frame:
        self._views.update((v.rid, v) for v in d.snapshot.requests)
        self._tracks.update((t.rid, t) for t in d.tracks)
        self._texts.update(d.texts)
        self._prompts.update(d.prompts)
        self._slos.update(d.slos)
        self._log.extend(d.log)
        return replace(
            d,
            snapshot=replace(d.snapshot, requests=tuple(self._views.values())),
            texts=dict(self._texts),
            prompts=dict(self._prompts),
            log=tuple(self._log),
            tracks=tuple(self._tracks.values()),
            slos=dict(self._slos),
        )

    def note(self, f: Frame, kind: str, text: str) -> Frame:
        """A frame like ``f`` with one more log entry (the parent's own news, e.g. a dead child)."""
        seq = self._log[-1].seq + 1 if self._log else 1
        self._log.append(LogEntry(seq=seq, step=f.steps_done, time_s=f.snapshot.time_s, kind=kind, text=text))
        return replace(f, seq=f.seq + 1, log=tuple(self._log), paused=True)  # a new frame: drawn
