"""The loop that owns a race, as EngineRunner owns an engine: commands in, frames out.

The same commands as the app's runner (pause, step once, step delay, publish interval) plus
``Restart``. The loop steps the race one forward pass at a time (``Race.step``: the lane that is
furthest behind on its own clock) and publishes a ``RaceFrame``. No torch here: the race comes
from a factory (built in the engine process by ``tui.runners.race_child``, or in the app's process for
tests and ``--engine-thread``), so the app can import this module for its types.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Callable

from tinyllm.race.views import LaneView
from tui.runners.interface import (MAX_DELAY_MS, LogEntry, SetDelay, SetPaused, SetPublishInterval, StepOnce,
                          TogglePaused)

PUBLISH_S = 1 / 30
LOG_LINES = 50


@dataclass(frozen=True)
class Restart:
    """Run the race again from the start (the same requests, fresh lanes)."""


@dataclass(frozen=True)
class RaceFrame:
    seq: int
    lanes: tuple[LaneView, ...]
    paused: bool
    step_delay_ms: int
    turns: int                       # steps made, all lanes together
    last_lane: str | None            # the lane that made the latest step
    log: tuple[LogEntry, ...]
    status: str = "ready"            # "loading" until the lanes are built (engine process)

    @property
    def done(self) -> bool:
        return bool(self.lanes) and all(lane.finished for lane in self.lanes)


class RaceRunner:
    """Owns one race (see the module docstring); the app's Runner interface, for a RaceFrame."""

    def __init__(self, make_race: Callable[[], object], paused: bool = False, step_delay_ms: int = 0,
                 device: str = "cpu", threads: int = 0, on_frame: Callable[[], None] | None = None):
        self.make_race = make_race
        self.race = make_race()
        self.paused = paused
        self.step_delay_ms = max(0, min(MAX_DELAY_MS, step_delay_ms))
        self.device, self.threads = device, threads
        self.start_error: Exception | None = None
        self.on_frame = on_frame
        self.publish_s = PUBLISH_S
        self.commands: queue.Queue = queue.Queue()
        self.last_traceback: str | None = None
        self._stop = threading.Event()
        self._log: deque[LogEntry] = deque(maxlen=LOG_LINES)
        self._log_seq = self._seq = 0
        self._finished: set[str] = set()
        self._published_at = 0.0
        self._frame = self._make_frame()

    # -- UI side (any thread) --------------------------------------------------------------------
    @property
    def frame(self) -> RaceFrame:
        return self._frame

    @property
    def steps_done(self) -> int:
        return self.race.turns

    def send(self, cmd) -> None:
        self.commands.put(cmd)

    def stop(self) -> None:
        self._stop.set()
        self.commands.put(None)

    # -- the loop ----------------------------------------------------------------------------------
    def run(self, cancelled: Callable[[], bool] = lambda: False) -> None:
        dirty = True
        while not (self._stop.is_set() or cancelled()):
            try:
                dirty |= self._drain(block=not self._can_run())
                if self._can_run():
                    self._step()
                    dirty = True
                    if self.step_delay_ms:
                        self._publish()
                        dirty = self._drain(block=True, timeout=self.step_delay_ms / 1000)
                if dirty and (not self._can_run() or time.perf_counter() - self._published_at >= self.publish_s):
                    self._publish()
                    dirty = False
            except Exception as e:                        # keep the loop (and the app) alive, say what broke
                self.last_traceback = traceback.format_exc()
                self.paused = True
                self._add_log("error", f"race error: {type(e).__name__}: {e}; race paused")
                time.sleep(0.05)
                dirty = True
        self._publish()

    def _can_run(self) -> bool:
        return not self.paused and not self.race.done()

    def _drain(self, block: bool, timeout: float = 0.05) -> bool:
        changed = False
        deadline = time.perf_counter() + timeout
        while True:
            try:
                cmd = (self.commands.get(timeout=max(0.0, deadline - time.perf_counter())) if block
                       else self.commands.get_nowait())
            except queue.Empty:
                return changed
            if cmd is None:
                return True
            self._apply(cmd)
            changed, block = True, False
            if isinstance(cmd, (StepOnce, SetPaused, TogglePaused, Restart)) and not self.paused:
                return True

    def _apply(self, cmd) -> None:
        if isinstance(cmd, (SetPaused, TogglePaused)):
            self.paused = cmd.paused if isinstance(cmd, SetPaused) else not self.paused
        elif isinstance(cmd, StepOnce):
            if not self.paused:
                return
            if self.race.done():
                self._add_log("info", "the race is over: r runs it again")
            else:
                self._step()
        elif isinstance(cmd, SetDelay):
            self.step_delay_ms = max(0, min(MAX_DELAY_MS, int(cmd.ms)))
        elif isinstance(cmd, SetPublishInterval):
            self.publish_s = min(1.0, max(PUBLISH_S, float(cmd.seconds)))
        elif isinstance(cmd, Restart):
            self.race = self.make_race()
            self._finished.clear()
            self._add_log("info", "the race starts again")

    def _step(self) -> None:
        try:
            lane = self.race.step()
        except Exception as e:
            self.last_traceback = traceback.format_exc()
            self.paused = True
            self._add_log("error", f"a race step failed: {type(e).__name__}: {e}; race paused")
            return
        if lane is not None and lane.key not in self._finished and not lane.has_work():
            self._finished.add(lane.key)
            place = len(self._finished)
            self._add_log("finish", f"{lane.title} finished {_ordinal(place)}: {lane.clock.elapsed:.2f} s of its clock")

    def _add_log(self, kind: str, text: str) -> None:
        self._log_seq += 1
        self._log.append(LogEntry(self._log_seq, self.race.turns, 0.0, kind, text))

    def _make_frame(self) -> RaceFrame:
        self._seq += 1
        return RaceFrame(self._seq, self.race.views(), self.paused, self.step_delay_ms, self.race.turns,
                         self.race.last, tuple(self._log))

    def _publish(self) -> None:
        self._published_at = time.perf_counter()
        self._frame = self._make_frame()
        if self.on_frame is not None:
            self.on_frame()


def _ordinal(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")
