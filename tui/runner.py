"""The one thread that owns the engine. The UI talks to it only through commands and snapshots.

The engine is not thread-safe, so exactly this thread calls it. The UI puts commands on a
queue (submit, abort, pause, step once, ...); between steps the runner drains them, steps the
engine, decodes new tokens incrementally and publishes a ``Frame``: an immutable snapshot plus
the text of every request and the event log. The UI reads the newest frame at its own rate, so
UI cost does not grow with the token rate. Nothing here imports textual.

The app runs this loop in a child process by default (``tui.process_runner``: commands and
frames are plain picklable dataclasses for that reason), or in a worker thread of its own.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Callable

from tinyllm.engine import ContinuousEngine, Request, Sampling
from tinyllm.snapshot import EngineSnapshot
from tinyllm.tokenizer import Tokenizer, TokenStream
from tinyllm.workload import WorkItem

MAX_DELAY_MS = 1000
LOG_LINES = 500
PUBLISH_S = 1 / 30


# -- commands (UI → runner) -----------------------------------------------------------------
@dataclass(frozen=True)
class Submit:
    prompt: str
    max_new_tokens: int
    sampling: Sampling
    stop_at_eos: bool = True
    tokens: tuple[int, ...] | None = None    # pre-tokenized (workloads); else encoded here


@dataclass(frozen=True)
class LoadWorkload:
    name: str
    items: tuple[WorkItem, ...]
    tokens: tuple[tuple[int, ...], ...]
    default_new: int
    default_sampling: Sampling


@dataclass(frozen=True)
class Abort:
    rid: int


@dataclass(frozen=True)
class AbortAll:
    pass


@dataclass(frozen=True)
class SetPaused:
    paused: bool


@dataclass(frozen=True)
class TogglePaused:
    """Pause if running, resume if paused (decided by the runner, so two quick presses cancel out)."""


@dataclass(frozen=True)
class SetPublishInterval:
    """The UI draws every ``seconds`` at best: publishing more often than that is wasted work."""
    seconds: float


@dataclass(frozen=True)
class StepOnce:
    pass


@dataclass(frozen=True)
class SetDelay:
    ms: int


# -- what the runner publishes (runner → UI) ---------------------------------------------------
@dataclass(frozen=True)
class LogEntry:
    seq: int
    step: int
    time_s: float
    kind: str          # submit / admit / preempt / finish / abort / error / info
    text: str
    rid: int | None = None
    slot: int | None = None   # the slot the event happened in (admit: taken; others: freed)


@dataclass(frozen=True)
class Frame:
    """Everything the UI shows, immutable. ``seq`` grows with each publish."""
    seq: int
    snapshot: EngineSnapshot
    prompts: dict[int, str]              # rid → prompt text
    texts: dict[int, str]                # rid → generated text so far (decoded incrementally)
    log: tuple[LogEntry, ...]            # the newest LOG_LINES entries
    paused: bool
    step_delay_ms: int
    pending_arrivals: int                # workload requests not yet arrived
    tokens_per_s: float                  # recent generation rate (all requests)
    tps_history: tuple[float, ...]       # one point per ~0.25 s, newest last
    step_ms: float = 0.0                 # duration of the latest engine step
    steps_done: int = 0                  # engine steps this runner has made


@dataclass
class _Pending:
    due_s: float
    item: WorkItem
    tokens: tuple[int, ...]
    default_new: int
    default_sampling: Sampling


class EngineRunner:
    def __init__(self, engine: ContinuousEngine, tokenizer: Tokenizer, paused: bool = False,
                 step_delay_ms: int = 0, on_frame: Callable[[], None] | None = None):
        self.engine = engine
        self.tok = tokenizer
        self.commands: queue.Queue = queue.Queue()
        self.paused = paused
        self.step_delay_ms = max(0, min(MAX_DELAY_MS, step_delay_ms))
        self.on_frame = on_frame              # optional wake-up hook (called from this thread)
        self._stop = threading.Event()
        self._streams: dict[int, TokenStream] = {}
        self._texts: dict[int, str] = {}
        self._prompts: dict[int, str] = {}
        self._log: deque[LogEntry] = deque(maxlen=LOG_LINES)
        self._log_seq = 0
        self._pending: list[_Pending] = []
        self._clock = 0.0                      # workload clock: runs only while not paused
        self._clock_mark: float | None = None
        self._states: dict[int, tuple[str, int | None]] = {}
        self._rate: deque[tuple[float, int]] = deque()
        self._tps_hist: deque[float] = deque(maxlen=120)
        self._last_hist = 0.0
        self._step_ms = 0.0
        self._seq = 0
        self.steps_done = 0
        self.last_traceback: str | None = None
        self._published_at = 0.0
        self.publish_s = PUBLISH_S
        self._snap = engine.snapshot()             # refreshed by _note_states after every change
        self._frame: Frame = self._make_frame()

    # -- UI side (any thread) ------------------------------------------------------------------
    @property
    def device(self) -> str:
        return self.engine.device.type

    @property
    def frame(self) -> Frame:
        """The newest published frame (an atomic reference read)."""
        return self._frame

    def send(self, cmd) -> None:
        self.commands.put(cmd)

    def stop(self) -> None:
        self._stop.set()
        self.commands.put(None)               # wake the loop at once

    # -- runner thread -------------------------------------------------------------------------
    def run(self, cancelled: Callable[[], bool] = lambda: False) -> None:
        """The loop; returns promptly after ``stop()`` or when ``cancelled()`` is true.

        Frames are published at most every ``publish_s`` while running flat out (the UI reads at
        ~20 Hz anyway), and at once when the engine is idle, paused, or slowed down."""
        dirty = True
        while not (self._stop.is_set() or cancelled()):
            try:
                dirty |= self._drain(block=not self._can_run())
                dirty |= self._release_arrivals()
                if self._can_run():
                    self._step()
                    dirty = True
                    if self.step_delay_ms:
                        self._publish()
                        dirty = self._drain(block=True, timeout=self.step_delay_ms / 1000)
                if dirty and (not self._can_run() or time.perf_counter() - self._published_at >= self.publish_s):
                    self._publish()
                    dirty = False
            except Exception as e:                    # keep the loop (and the app) alive, say what broke
                self.last_traceback = traceback.format_exc()
                self.paused = True
                self._error(f"runner error: {type(e).__name__}: {e}; engine paused")
                time.sleep(0.05)
                dirty = True
        self._publish()

    def _can_run(self) -> bool:
        return not self.paused and (self.engine.has_work() or bool(self._due_now()))

    def _drain(self, block: bool, timeout: float = 0.05) -> bool:
        """Apply queued commands. Blocks up to ``timeout`` for the first one when asked to."""
        changed = False
        deadline = time.perf_counter() + timeout
        while True:
            try:
                if block:
                    cmd = self.commands.get(timeout=max(0.0, deadline - time.perf_counter()))
                else:
                    cmd = self.commands.get_nowait()
            except queue.Empty:
                return changed
            if cmd is None:                    # stop() wake-up
                return True
            self._apply(cmd)
            changed = True
            block = False                      # after the first command, just drain the rest
            if isinstance(cmd, (StepOnce, SetPaused, TogglePaused)) and not self.paused:
                return True

    def _apply(self, cmd) -> None:
        eng = self.engine
        try:
            if isinstance(cmd, Submit):
                self._submit(cmd.prompt, cmd.tokens, cmd.max_new_tokens, cmd.sampling, cmd.stop_at_eos)
            elif isinstance(cmd, LoadWorkload):
                self._tick_clock()
                for it, toks in zip(cmd.items, cmd.tokens):
                    self._pending.append(_Pending(self._clock + it.arrival_s, it, toks, cmd.default_new,
                                                  cmd.default_sampling))
                self._pending.sort(key=lambda p: p.due_s)
                self._add_log("info", f"loaded {cmd.name}: {len(cmd.items)} requests")
            elif isinstance(cmd, Abort):
                if eng.abort(cmd.rid):
                    self._note_states()
                else:
                    self._add_log("info", f"#{cmd.rid} is not running or queued; nothing to abort")
            elif isinstance(cmd, AbortAll):
                n = len(self._pending)
                self._pending.clear()
                for v in eng.snapshot().requests:
                    if v.state in ("queued", "running", "preempted"):
                        eng.abort(v.rid)
                self._note_states()
                if n:
                    self._add_log("abort", f"dropped {n} workload requests that had not arrived")
            elif isinstance(cmd, (SetPaused, TogglePaused)):
                self._tick_clock()
                self.paused = cmd.paused if isinstance(cmd, SetPaused) else not self.paused
                self._clock_mark = None
                self._add_log("info", "paused" if cmd.paused else "resumed")
            elif isinstance(cmd, StepOnce):
                if self.paused:
                    self._clock += 0.05                       # the workload clock moves one tick
                    self._release_arrivals()
                    if eng.has_work():
                        self._step()
                    else:
                        self._add_log("info", "step: nothing to do (no queued or running requests)")
            elif isinstance(cmd, SetPublishInterval):
                self.publish_s = min(1.0, max(PUBLISH_S, float(cmd.seconds)))
            elif isinstance(cmd, SetDelay):
                self.step_delay_ms = max(0, min(MAX_DELAY_MS, int(cmd.ms)))
        except Exception as e:                                 # never let the UI's request kill the loop
            self._error(f"{type(cmd).__name__} failed: {e}")

    def _submit(self, prompt: str, tokens, max_new: int, sampling: Sampling, stop_at_eos: bool) -> None:
        ids = list(tokens) if tokens is not None else self.tok.encode(prompt)
        try:
            rid = self.engine.add_request(Request(ids, max_new, self.tok.eos_id if stop_at_eos else None, sampling))
        except ValueError as e:
            self._error(f"request refused: {e}")
            return
        self._prompts[rid] = prompt
        self._texts[rid] = ""
        self._streams[rid] = self.tok.stream(skip_special_tokens=True)
        self._add_log("submit", f"#{rid} queued ({len(ids)} prompt tokens, max {max_new} new, {sampling.describe()})", rid)
        self._note_states()

    def _due_now(self) -> list[_Pending]:
        now = self._tick_clock()
        return [p for p in self._pending if p.due_s <= now]

    def _release_arrivals(self) -> bool:
        due = self._due_now()
        for p in due:
            self._pending.remove(p)
            it = p.item
            self._submit(it.prompt, p.tokens, it.max_new_tokens or p.default_new,
                         it.sampling or p.default_sampling, it.stop_at_eos)
        return bool(due)

    def _tick_clock(self) -> float:
        """Advance the workload clock by real time while running; frozen while paused."""
        now = time.perf_counter()
        if not self.paused and self._clock_mark is not None:
            self._clock += now - self._clock_mark
        self._clock_mark = now
        return self._clock

    def _step(self) -> None:
        t = time.perf_counter()
        try:
            events = self.engine.step()
        except Exception as e:
            self._error(f"engine step failed: {type(e).__name__}: {e}")
            self.last_traceback = traceback.format_exc()
            self.paused = True                                 # stop looping on a broken state
            self._add_log("error", "engine paused after an error; press space to retry")
            self._note_states()                       # show whatever state the failed step left
            return
        self._step_ms = (time.perf_counter() - t) * 1000
        self.steps_done += 1
        for ev in events:
            stream = self._streams.get(ev.rid)
            if stream is not None:
                self._texts[ev.rid] += stream.step(ev.token)
        self._rate.append((time.perf_counter(), len(events)))
        self._note_states()

    def _note_states(self) -> None:
        """Log admissions, preemptions, finishes and aborts by diffing request states."""
        snap = self._snap = self.engine.snapshot()        # the next frame publishes this one
        for v in snap.requests:
            old = self._states.get(v.rid)
            new = (v.state, v.slot)
            if old == new:
                continue
            self._states[v.rid] = new
            was = old[1] if old is not None else None
            if v.state == "running" and (old is None or old[0] != "running"):
                again = " again (recompute)" if v.preemptions else ""
                self._add_log("admit", f"#{v.rid} admitted to slot {v.slot}{again}", v.rid, v.slot)
            elif v.state == "preempted":
                self._add_log("preempt", f"#{v.rid} preempted from slot {was}: out of KV blocks, back to the "
                                         f"queue ({len(v.prompt) + len(v.tokens)} tokens to recompute)", v.rid, was)
            elif v.state == "finished":
                why = "end-of-text" if v.eos_id is not None and v.tokens and v.tokens[-1] == v.eos_id else "max tokens"
                self._add_log("finish", f"#{v.rid} finished: {len(v.tokens)} tokens ({why})", v.rid, was)
            elif v.state == "aborted":
                self._add_log("abort", f"#{v.rid} aborted after {len(v.tokens)} tokens", v.rid, was)

    def _add_log(self, kind: str, text: str, rid: int | None = None, slot: int | None = None) -> None:
        self._log_seq += 1
        self._log.append(LogEntry(self._log_seq, self.steps_done, self.engine.now(), kind, text, rid, slot))

    def _error(self, msg: str) -> None:
        """Errors go to the log; the UI notifies for each new 'error' entry it sees."""
        self._add_log("error", msg)

    def _tokens_per_s(self) -> float:
        now = time.perf_counter()
        while self._rate and self._rate[0][0] < now - 2.0:
            self._rate.popleft()
        if not self._rate:
            return 0.0
        span = max(0.25, now - self._rate[0][0])
        tps = sum(n for _, n in self._rate) / span
        if now - self._last_hist >= 0.25:
            self._tps_hist.append(tps)
            self._last_hist = now
        return tps

    def _make_frame(self) -> Frame:
        self._seq += 1
        return Frame(self._seq, self._snap, dict(self._prompts), dict(self._texts), tuple(self._log),
                     self.paused, self.step_delay_ms, len(self._pending), self._tokens_per_s(),
                     tuple(self._tps_hist), self._step_ms, self.steps_done)

    def _publish(self) -> None:
        self._published_at = time.perf_counter()
        self._frame = self._make_frame()
        if self.on_frame is not None:
            self.on_frame()
