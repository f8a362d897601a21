"""A lane's own clock: the race's fairness rule in one object.

The lanes share one process and take turns, so wall time would charge each lane for the others'
steps. A LaneClock runs only inside its lane's step() (and jumps over the idle gaps before a
request arrives), so a lane's elapsed time, tokens/s, TTFT and latency are its own compute only.
A fixed ``step_cost_s`` makes every step cost exactly that: deterministic screens for tests.
A ``cost`` model (cost.py) makes each step cost what its passes' work costs (the lane charges
each pass before it runs): the same figures on every run, whatever else the machine does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from tinyllm.race.cost import CostModel, PassWork

T = TypeVar("T")


class LaneClock:
    def __init__(self, step_cost_s: float | None = None, cost: CostModel | None = None):
        self.step_cost_s = step_cost_s  # None: measure each step with perf_counter (or price it)
        self.cost = cost  # the cost clock's model (None: the wall clock)
        self.elapsed = 0.0
        self.idle = 0.0  # of elapsed: waiting for arrivals (skip_to), no compute
        self._started: float | None = None
        self._charged = 0.0  # the cost clock: this step's passes so far
        self._work: PassWork | None = None  # this step's work so far
        self.samples: list[tuple[PassWork, float]] | None = None  # set to a list: (work, wall s) per step

    @property
    def kind(self) -> str:
        """Which clock: "fixed", "cost" or "wall"."""
        return "fixed" if self.step_cost_s is not None else "cost" if self.cost is not None else "wall"

    def charge(self, work: PassWork) -> None:
        """A pass of this step is about to run with this much work (the cost clock prices it)."""
        self._work = work if self._work is None else self._work + work
        if self.cost is not None:
            self._charged += self.cost.cost(work)

    def now(self) -> float:
        """Seconds on this lane's clock; inside a step, the step's time so far (a fixed-cost
        clock stamps everything in a step at its end)."""
        if self._started is None:
            return self.elapsed
        if self.step_cost_s is not None:
            return self.elapsed + self.step_cost_s
        if self.cost is not None:
            return self.elapsed + self._charged
        return self.elapsed + time.perf_counter() - self._started

    def timed(self, fn: Callable[[], T]) -> T:
        """Run one step of the lane with the clock running."""
        self._started = time.perf_counter()
        self._charged, self._work = 0.0, None
        try:
            return fn()
        finally:
            if self.samples is not None and self._work is not None:
                self.samples.append((self._work, time.perf_counter() - self._started))
            self.elapsed = self.now()
            self._started = None

    def skip_to(self, t: float) -> None:
        """Idle until ``t`` (the next arrival): no compute, no real waiting."""
        self.idle += max(0.0, t - self.elapsed)
        self.elapsed = max(self.elapsed, t)
