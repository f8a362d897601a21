"""How the tools write a duration (and a count): one format for the app, the race, what-if and the bench, so a
TTFT reads the same wherever it is shown (it was `0.01s` in the bench, `24 ms` in a race lane and
`24ms` in the app). No torch."""

from __future__ import annotations

import math


def duration(seconds: float | None) -> str:
    """At most 6 cells: 67ms, 1.23s, 12.3s, 2m05s, 1h02m; "—" for None or a value that is not a
    finite number (a screen never raises over a figure). Each unit is chosen after rounding, so
    0.9996 s is 1.00s, not 1000ms."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    if round(seconds * 1000) < 1000:
        return f"{sign}{seconds * 1000:.0f}ms"
    if round(seconds, 2) < 10:
        return f"{sign}{seconds:.2f}s"
    if round(seconds, 1) < 60:
        return f"{sign}{seconds:.1f}s"
    m, s = divmod(round(seconds), 60)
    return f"{sign}{m}m{s:02d}s" if m < 60 else f"{sign}{m // 60}h{m % 60:02d}m"


def count(n: int, noun: str) -> str:
    """'1 request', '8 requests'."""
    return f"{n} {noun}{'s' * (n != 1)}"
