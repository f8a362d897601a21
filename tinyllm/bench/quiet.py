"""Was the machine quiet while the bench ran? The CPU time the whole machine spent busy, less
this process's own, over the run's wall time and the machine's cores: the share other processes
took. A busy machine slows each path by a different amount (a test run, a browser, another
bench), so its figures can contradict each other (a step at 8 rows slower than at 16); the
report then says so instead of leaving the reader to guess. Linux only (``/proc/stat``);
elsewhere nothing is measured and nothing is said."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

BUSY_SHARE = 0.15  # others' share of all cores above which the report warns
PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class Reading:
    wall: float  # seconds (monotonic)
    busy: float | None  # the machine's busy CPU seconds since boot (every core), or None unknown
    own: float  # this process's CPU seconds (user + system, its children included)
    cores: int


def _machine_busy_s() -> float | None:
    """Busy CPU seconds since boot over all cores: /proc/stat's first line less idle and iowait."""
    try:
        fields = PROC_STAT.read_text().split("\n", 1)[0].split()
        ticks = [int(x) for x in fields[1:]]
    except (OSError, ValueError, IndexError):
        return None
    if fields[0] != "cpu" or len(ticks) < 5:
        return None
    busy = sum(ticks[:8]) - ticks[3] - ticks[4]  # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def read() -> Reading:
    try:
        import resource  # (not on Windows: nothing measured there)
    except ImportError:
        return Reading(time.monotonic(), None, 0.0, os.cpu_count() or 1)
    own = sum(
        getattr(resource.getrusage(who), f)
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        for f in ("ru_utime", "ru_stime")
    )
    return Reading(time.monotonic(), _machine_busy_s(), own, os.cpu_count() or 1)


def others_share(before: Reading, after: Reading) -> float | None:
    """The share of all cores other processes kept busy between two readings (0..1), or None
    where the machine's busy time cannot be read or no time passed."""
    wall = after.wall - before.wall
    if before.busy is None or after.busy is None or wall <= 0:
        return None
    others = (after.busy - before.busy) - (after.own - before.own)
    return min(1.0, max(0.0, others / (wall * after.cores)))


def warning(share: float | None, cores: int, threads: int | None = None) -> str | None:
    """What the report says of a busy machine, or None for a quiet one (or one not measured).
    Where the run's threads outnumber the cores the others left free, it says that this, not the
    paths, is what slowed it: each step's threads wait for the slowest, on a busy core."""
    if share is None or share < BUSY_SHARE:
        return None
    said = (
        f"Other processes kept {share:.0%} of this machine's {cores} cores busy during the run: each path "
        f"was slowed by a different amount, so these figures can contradict each other."
    )
    free = cores * (1 - share)
    if threads and threads > 1 and threads > free + 0.25:
        return (
            f"{said} This run's {threads} threads outnumbered the ~{free:.1f} cores left free: every step "
            f"waits for its slowest thread, on a busy core, so every figure may be many times too low; "
            f"--threads {max(1, int(free + 0.25))} leaves the busy cores alone."
        )
    return f"{said} Run it again on a quiet machine to compare paths."
