"""The one loop that owns what a runner runs (an engine, the race): commands in, frames out.

Exactly one thread calls the owned object (it is not thread-safe). Between steps the loop drains
the commands the UI queued; it steps while running and there is work; it publishes a frame at
most every ``publish_s`` while running flat out (the UI reads at ~20 Hz anyway), and at once when
idle, paused or slowed down (``step_delay_ms`` between steps). A command that fails, or a bug
in a step, is said in the log and pauses the loop: the app never loses its runner.

Subclasses say what a step is and what a frame holds (``_can_run``, ``_step``, ``_apply``,
``_make_frame``, ``_log_error``) and may hook ``_before_step`` (arrivals), ``_published``
(recording) and ``_closed``. The commands every runner shares (step delay, publish interval)
are applied here.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Callable

from tui.runners.interface import MAX_DELAY_MS, RunnerDefaults, SetDelay, SetPaused, SetPublishInterval, StepOnce

PUBLISH_S = 1 / 30


class CommandLoop(RunnerDefaults):
    mode = "live"  # interface.Runner: a local engine (or the race)
    WAKE: tuple[type, ...] = (StepOnce, SetPaused)  # after these a running loop steps at once

    def __init__(self, paused: bool, step_delay_ms: int, on_frame: Callable[[], None] | None = None):
        self.commands: queue.Queue = queue.Queue()
        self.paused = paused
        self.step_delay_ms = max(0, min(MAX_DELAY_MS, step_delay_ms))
        self.on_frame = on_frame  # optional hook, called in this thread after each publish
        self.publish_s = PUBLISH_S
        self.last_traceback: str | None = None
        self.start_error: Exception | None = None  # never: a loop gets what it runs already built
        self._stop = threading.Event()
        self._published_at = 0.0

    # -- UI side (any thread) ------------------------------------------------------------------
    @property
    def frame(self):
        """The newest published frame (an atomic reference read)."""
        return self._frame

    def send(self, cmd) -> None:
        self.commands.put(cmd)

    def stop(self) -> None:
        self._stop.set()
        self.commands.put(None)  # wake the loop at once

    # -- the loop ------------------------------------------------------------------------------
    def run(self, cancelled: Callable[[], bool] = lambda: False) -> None:
        """The loop; returns promptly after ``stop()`` or when ``cancelled()`` is true."""
        dirty = True
        while not (self._stop.is_set() or cancelled()):
            try:
                dirty |= self._drain(block=not self._can_run())
                dirty |= self._before_step()
                if self._can_run():
                    self._step()
                    dirty = True
                    if self.step_delay_ms:
                        self._publish()
                        dirty = self._drain(block=True, timeout=self.step_delay_ms / 1000)
                if dirty and (not self._can_run() or time.perf_counter() - self._published_at >= self.publish_s):
                    self._publish()
                    dirty = False
            except Exception as e:  # keep the loop (and the app) alive, say what broke
                self.last_traceback = traceback.format_exc()
                self._set_paused(True)
                self._log_error(f"runner error: {type(e).__name__}: {e}; paused")
                time.sleep(0.05)
                dirty = True
        self._publish()
        self._closed()

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
            if cmd is None:  # stop() wake-up
                return True
            if isinstance(cmd, SetDelay):
                self.step_delay_ms = max(0, min(MAX_DELAY_MS, int(cmd.ms)))
            elif isinstance(cmd, SetPublishInterval):
                self.publish_s = min(1.0, max(PUBLISH_S, float(cmd.seconds)))
            else:
                self._apply(cmd)
            changed = True
            block = False  # after the first command, just drain the rest
            if isinstance(cmd, self.WAKE) and not self.paused:
                return True

    def _publish(self) -> None:
        self._published_at = time.perf_counter()
        self._frame = self._make_frame()
        self._published()
        if self.on_frame is not None:
            self.on_frame()

    # -- what a subclass says ------------------------------------------------------------------
    def _can_run(self) -> bool:
        raise NotImplementedError

    def _step(self) -> None:
        raise NotImplementedError

    def _apply(self, cmd) -> None:
        raise NotImplementedError

    def _make_frame(self):
        raise NotImplementedError

    def _log_error(self, text: str) -> None:
        raise NotImplementedError

    def _set_paused(self, paused: bool) -> None:
        """Pause or resume (a subclass may stop a clock with it)."""
        self.paused = paused

    def _before_step(self) -> bool:
        """Anything to do before a step (e.g. workload arrivals); True if it changed something."""
        return False

    def _published(self) -> None:
        """After a frame is published (e.g. record it)."""

    def _closed(self) -> None:
        """After the loop's last frame."""
