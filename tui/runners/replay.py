"""A recording played back: the runner interface (messages.Runner) with no engine and no model.

The app cannot tell it from a live runner except by ``replay``: it reads ``frame`` and sends
commands. Space plays and pauses, step once moves one engine step, ``StepBack`` one back,
``SeekStep`` to any step, ``JumpEvent`` to the selected request's next or previous admission,
preemption or end; the step delay sets the speed (0: the recorded pace).

Seeking back rebuilds the frame from the nearest keyframe (a copy of the rebuilt state every
KEY_EVERY records) forward, so any step is a few hundred small deltas away.
"""

from __future__ import annotations

import bisect
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tinyllm.observe.recording import BAD_RECORD, RecordingError, read_recording
from tui.runners.frames import FrameBuilder
from tui.runners.interface import (
    MAX_DELAY_MS,
    Frame,
    JumpEvent,
    RunnerDefaults,
    SeekStep,
    SetDelay,
    SetPaused,
    StepBack,
    StepOnce,
)

KEY_EVERY = 200
MAX_GAP_S = 0.5  # at the recorded pace, a long idle gap (the run was paused) plays this fast
JUMP_KINDS = ("admitted", "preempted", "aborted", "finished", "failed")


class ReplayRunner(RunnerDefaults):
    """Plays a ``--record`` file; satisfies messages.Runner."""

    mode = "replay"  # interface.Runner: a recording, read-only
    device = "replay"
    threads = 0
    start_error: Exception | None = None

    def __init__(self, path: str | Path, paused: bool = False, step_delay_ms: int = 0):
        self.path = Path(path)
        self.header, records, self.warning = read_recording(self.path)
        self._records = [rec for _, rec in records]
        self.steps = [rec["step"] for rec in self._records]  # per record, non-decreasing
        self._events: dict[int, list[tuple[int, str]]] = {}  # rid → [(record index, kind)]
        self._keys: list[tuple[int, FrameBuilder]] = [(-1, FrameBuilder(self.header))]
        self._times: list[float] = []  # engine clock after each record
        b = self._keys[0][1].copy()
        for i, (line, rec) in enumerate(records):  # check every record once, now
            if i and rec["step"] < self.steps[i - 1]:
                raise RecordingError(
                    f"{self.path}:{line}: step {rec['step']} comes after step "
                    f"{self.steps[i - 1]} (records must be in step order)"
                )
            try:
                b.apply(rec)
                self._times.append(b.snapshot.time_s)
                for row in rec.get("life", ()):
                    if row[0] in JUMP_KINDS:
                        self._events.setdefault(int(row[1]), []).append((i, row[0]))
            except BAD_RECORD as e:
                raise RecordingError(f"{self.path}:{line}: a broken record ({type(e).__name__}: {e})") from None
            if (i + 1) % KEY_EVERY == 0:
                self._keys.append((i, b.copy()))
        self.last_step = self.steps[-1] if self.steps else 0
        self.paused = paused
        self.step_delay_ms = max(0, min(MAX_DELAY_MS, step_delay_ms))
        self.commands: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._seq = 0
        self._pos = -1
        self._builder = self._keys[0][1].copy()
        self.steps_done = 0  # as a live runner: the frame's step count
        self._frame = self._make_frame()
        if self._records:
            self._seek(self._last_of(self.steps[0]))  # the first step, as it was

    # -- the Runner interface ---------------------------------------------------------------------
    @property
    def frame(self) -> Frame:
        return self._frame

    @property
    def step(self) -> int:
        """The engine step shown now."""
        return self._builder.step if self._pos >= 0 else 0

    @property
    def at_end(self) -> bool:
        return self._pos >= len(self._records) - 1

    def send(self, cmd) -> None:
        self.commands.put(cmd)

    def stop(self) -> None:
        self._stop.set()
        self.commands.put(None)

    def run(self, cancelled: Callable[[], bool] = lambda: False) -> None:
        """Apply commands; while playing, move one step each delay (or at the recorded pace)."""
        due = time.monotonic()
        while not (self._stop.is_set() or cancelled()):
            playing = not self.paused and not self.at_end
            wait = max(0.0, due - time.monotonic()) if playing else 0.1
            try:
                cmd = self.commands.get(timeout=wait)
            except queue.Empty:
                cmd = None
            if cmd is not None:
                self.apply(cmd)
                due = time.monotonic() + self._gap()
                continue
            if playing and time.monotonic() >= due:
                self._seek(self._last_of(self._next_step(+1)))
                if self.at_end:
                    self.paused = True  # the end: stop there, as a video does
                    self._publish()
                due = time.monotonic() + self._gap()

    # -- commands -------------------------------------------------------------------------------
    def apply(self, cmd) -> None:
        """Carry out one command now (the run loop's way; tests call it directly)."""
        if isinstance(cmd, SetPaused):
            self.paused = cmd.after(self.paused)
            if not self.paused and self.at_end:  # play again from the start
                self._seek(self._last_of(self.steps[0]) if self.steps else -1)
        elif isinstance(cmd, (StepOnce, StepBack)):  # a frame step pauses, as a video player's does
            self.paused = True  # (while playing, the next tick undid a step back at once)
            self._seek(self._last_of(self._next_step(+1 if isinstance(cmd, StepOnce) else -1)))
        elif isinstance(cmd, SeekStep):
            self._seek(self._last_of(cmd.step))
        elif isinstance(cmd, JumpEvent):  # to the step of the event, as g would show it (its last record)
            i = self._event_index(cmd.rid, cmd.direction)
            self._seek(self._last_of(self.steps[i]) if 0 <= i < len(self.steps) else i)
        elif isinstance(cmd, SetDelay):
            self.step_delay_ms = max(0, min(MAX_DELAY_MS, int(cmd.ms)))
        self._publish()  # other commands do not apply to a replay

    def _next_step(self, direction: int) -> int:
        """The step after (or before) the one shown, among the recorded ones."""
        s = self.step
        if direction > 0:
            i = bisect.bisect_right(self.steps, s)
            return self.steps[i] if i < len(self.steps) else s
        i = bisect.bisect_left(self.steps, s) - 1
        return self.steps[i] if i >= 0 else (self.steps[0] if self.steps else 0)

    def _last_of(self, step: int) -> int:
        """The index of the last record at or before ``step`` (its state is "the engine at step")."""
        return max(0, bisect.bisect_right(self.steps, step) - 1) if self.steps else -1

    def _event_index(self, rid: int, direction: int) -> int:
        """The record of the request's next (previous) lifecycle moment, in another step than now."""
        evs = self._events.get(rid, [])
        s = self.step
        if direction > 0:
            return next((i for i, _ in evs if self.steps[i] > s), self._pos)
        return next((i for i, _ in reversed(evs) if self.steps[i] < s), self._pos)

    def event_steps(self, kinds: tuple[str, ...] = ("preempted", "aborted")) -> list[int]:
        """Steps where these lifecycle events happened (the scrubber marks them)."""
        return sorted({self.steps[i] for evs in self._events.values() for i, k in evs if k in kinds})

    def events_of(self, rid: int) -> list[tuple[int, str]]:
        return [(self.steps[i], k) for i, k in self._events.get(rid, [])]

    # -- moving -----------------------------------------------------------------------------------
    def _seek(self, index: int) -> None:
        index = max(-1, min(len(self._records) - 1, index))
        if not (self._pos <= index < self._pos + 2 * KEY_EVERY):  # back, or far ahead: a keyframe
            k = bisect.bisect_right([i for i, _ in self._keys], index) - 1
            self._pos, b = self._keys[k][0], self._keys[k][1]
            self._builder = b.copy()
        for i in range(self._pos + 1, index + 1):
            self._builder.apply(self._records[i])
        self._pos = index
        self._publish()

    def _gap(self) -> float:
        """Seconds until the next step plays: the step delay, or the recorded time between steps."""
        if self.step_delay_ms:
            return self.step_delay_ms / 1000
        nxt = self._last_of(self._next_step(+1))
        if nxt <= self._pos:
            return 0.1
        t0 = self._times[self._pos] if self._pos >= 0 else self._times[0]
        return min(MAX_GAP_S, max(0.0, self._times[nxt] - t0))

    def _make_frame(self) -> Frame:
        self._seq += 1
        f = self._builder.frame(self._seq, self.paused, self.step_delay_ms)
        self.steps_done = f.steps_done
        return f

    def _publish(self) -> None:
        self._frame = self._make_frame()
