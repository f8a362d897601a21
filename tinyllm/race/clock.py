"""A lane's own clock: the race's fairness rule in one object.

The lanes share one process and take turns, so wall time would charge each lane for the others'
steps. A LaneClock runs only inside its lane's step() (and jumps over the idle gaps before a
request arrives), so a lane's elapsed time, tokens/s, TTFT and latency are its own compute only.
A fixed ``step_cost_s`` makes every step cost exactly that: deterministic screens for tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class LaneClock:
    def __init__(self, step_cost_s: float | None = None):
        self.step_cost_s = step_cost_s  # None: measure each step with perf_counter
        self.elapsed = 0.0
        self.idle = 0.0  # of elapsed: waiting for arrivals (skip_to), no compute
        self._started: float | None = None

    def now(self) -> float:
        """Seconds on this lane's clock; inside a step, the step's time so far (a fixed-cost
        clock stamps everything in a step at its end)."""
        if self._started is None:
            return self.elapsed
        if self.step_cost_s is not None:
            return self.elapsed + self.step_cost_s
        return self.elapsed + time.perf_counter() - self._started

    def timed(self, fn: Callable[[], T]) -> T:
        """Run one step of the lane with the clock running."""
        self._started = time.perf_counter()
        try:
            return fn()
        finally:
            self.elapsed = self.now()
            self._started = None

    def skip_to(self, t: float) -> None:
        """Idle until ``t`` (the next arrival): no compute, no real waiting."""
        self.idle += max(0.0, t - self.elapsed)
        self.elapsed = max(self.elapsed, t)
