"""Live views: frame pacing (how often the app may redraw while the engine runs flat out), and
what every live view shares (``LiveView``: the paced tick, the pause / step / speed keys).

On a small machine every millisecond the UI spends drawing is taken from the engine (measured
with ``python -m tui.bench_app``: on 2 cores the UI's ~25% of a core at 20 Hz cost the engine
~30% of its tokens/s, as torch's two threads wait for each other when one loses its core). So
the app redraws at up to ``max_hz`` but watches its own thread's CPU time, and stretches the
interval between frames until it stays within ``budget`` of one core (never below ``min_hz``).
A fast machine keeps 20 Hz; a paused or idle engine costs nothing and the rate recovers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tui.runners.interface import MAX_DELAY_MS, TOGGLE_PAUSED, SetDelay, SetPublishInterval, StepOnce
from tui.widgets.deferred import deferred


class FramePacer:
    def __init__(
        self,
        max_hz: float = 20.0,
        min_hz: float = 5.0,
        budget: float = 0.10,
        window_s: float = 1.0,
        cpu: Callable[[], float] = time.thread_time,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.min_interval, self.max_interval = 1 / max_hz, 1 / min_hz
        self.budget, self.window_s = budget, window_s
        self.interval = self.min_interval
        self._cpu, self._clock = cpu, clock
        self._mark_t, self._mark_cpu = clock(), cpu()
        self._next = 0.0

    def due(self) -> bool:
        """Called on each refresh tick (the app ticks every ``interval``): may this tick draw?"""
        now = self._clock()
        if now - self._mark_t >= self.window_s:
            cpu = self._cpu()
            share = (cpu - self._mark_cpu) / (now - self._mark_t)  # fraction of one core
            target = self.interval * share / self.budget
            self.interval = min(self.max_interval, max(self.min_interval, (self.interval + target) / 2))
            self._mark_t, self._mark_cpu = now, cpu
        if now + self.min_interval / 2 < self._next:  # half a tick of slack for jitter
            return False
        self._next = now + self.interval
        return True


DELAY_STEPS = (0, 5, 10, 20, 50, 100, 200, 300, 500, 750, 1000)  # ms between steps: + / - walk them


class LiveView:
    """What the main app and the race screen share as views of a live runner: the paced redraw
    tick, and the keys that pace the runner (pause, step once, slower, faster). The host is a
    Textual App or Screen with ``runner``, ``_pacer`` (a FramePacer), ``_publish_s`` and its own
    ``refresh_from_runner``."""

    @deferred  # a timer's: nothing once the view is leaving
    def _tick(self) -> None:
        """Draw if due, then sleep until the pacer's next frame (no wake-ups in between: on a
        small machine each one takes a core from the engine). The runner publishes at that
        rate too."""
        self.refresh_from_runner()
        interval = self._pacer.interval
        if abs(interval - self._publish_s) > 0.2 * self._publish_s:
            self._publish_s = interval
            self.runner.send(SetPublishInterval(interval))
        self.set_timer(interval, self._tick)

    def action_toggle_pause(self) -> None:
        self.runner.send(TOGGLE_PAUSED)

    def action_step_once(self) -> None:
        if not self.runner.frame.paused:
            self.notify("Step once works while paused (space / F5 to pause).", severity="warning", timeout=3)
            return
        self.runner.send(StepOnce())

    def _set_delay(self, direction: int) -> None:
        cur = self.runner.frame.step_delay_ms
        new = (
            next((d for d in DELAY_STEPS if d > cur), MAX_DELAY_MS)
            if direction > 0
            else next((d for d in reversed(DELAY_STEPS) if d < cur), 0)
        )
        self.runner.send(SetDelay(new))

    def action_slower(self) -> None:
        self._set_delay(+1)

    def action_faster(self) -> None:
        self._set_delay(-1)
