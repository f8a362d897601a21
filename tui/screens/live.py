"""Frame pacing: how often the app may redraw while the engine runs flat out.

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


class FramePacer:
    def __init__(self, max_hz: float = 20.0, min_hz: float = 5.0, budget: float = 0.10, window_s: float = 1.0,
                 cpu: Callable[[], float] = time.thread_time, clock: Callable[[], float] = time.perf_counter):
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
            share = (cpu - self._mark_cpu) / (now - self._mark_t)       # fraction of one core
            target = self.interval * share / self.budget
            self.interval = min(self.max_interval, max(self.min_interval, (self.interval + target) / 2))
            self._mark_t, self._mark_cpu = now, cpu
        if now + self.min_interval / 2 < self._next:                     # half a tick of slack for jitter
            return False
        self._next = now + self.interval
        return True
