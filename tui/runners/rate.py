"""Tokens/s as the app shows it: one derivation for every runner, so a replay shows at each step
the rate the live app showed there (the live runner counted wall time over 2 s, the replay engine
time over 1 s: 158 against 136 tok/s at the same step of the same run)."""

from __future__ import annotations

from collections import deque

from tinyllm.observe.snapshot import EngineSnapshot

POINT_S = 0.25  # the tokens/s sparkline gets a point per this much engine time
WINDOW_S = 1.0  # tokens/s: over the last this much engine time
HISTORY = 120  # sparkline points kept


class TokenRate:
    """Tokens/s from the engine clock and counters of each snapshot (nothing recorded: it follows
    from them), over the last ``WINDOW_S`` of engine time, snapshot by snapshot. Engine time stops
    while paused, so a pause adds nothing. The first snapshot after an idle one starts the window
    afresh: a new burst's tokens are not spread over the idle time before it (the counter read 0
    for a second while requests ran); slow steps (a big model, a step delay) keep their window,
    however far apart their snapshots."""

    def __init__(self) -> None:
        self.tps = 0.0
        self.history: deque[float] = deque(maxlen=HISTORY)
        self._points: deque[tuple[float, int]] = deque()  # (engine time, tokens generated), the window
        self._was_idle = True  # the last snapshot had nothing running or waiting
        self._point_at = 0.0

    def update(self, snap: EngineSnapshot) -> float:
        t, n = snap.time_s, snap.counters.generated_tokens
        pts = self._points
        if pts and (self._was_idle or t < pts[-1][0] or n < pts[-1][1]):
            pts.clear()  # after idle time, or another engine (a restart)
        self._was_idle = not (snap.num_requests_running or snap.num_requests_waiting)
        if t < self._point_at:  # another engine's clock: points from its start
            self._point_at = t
        if not pts or t > pts[-1][0]:
            pts.append((t, n))
        while len(pts) > 2 and pts[1][0] <= t - WINDOW_S:  # the newest point at or before the window's start
            pts.popleft()
        t0, n0 = pts[0]
        self.tps = (n - n0) / (t - t0) if t > t0 else 0.0
        if t - self._point_at >= POINT_S:
            self.history.append(self.tps)
            self._point_at = t
        return self.tps

    def copy(self) -> TokenRate:
        r = TokenRate.__new__(TokenRate)
        r.__dict__.update(self.__dict__)
        r.history, r._points = deque(self.history, maxlen=HISTORY), deque(self._points)
        return r
