"""How the tools write a duration: one format for the app, the race, what-if and the bench, so a
TTFT reads the same wherever it is shown (it was `0.01s` in the bench, `24 ms` in a race lane and
`24ms` in the app). No torch."""

from __future__ import annotations


def duration(seconds: float | None) -> str:
    """At most 6 cells: 67ms, 1.23s, 12.3s, 2m05s, 1h02m; None is "—"."""
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 10:
        return f"{seconds:.2f}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(round(seconds), 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"
