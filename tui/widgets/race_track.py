"""The race track: each lane's tokens over its own clock, one band per lane on a shared time axis.

Why: the lanes' progress bars say who is ahead now; the track says how they got there. A steeper
band is a faster scheduler; a band that reaches the top has finished; static batching's band climbs
in stairs (a batch, then its long tail). Drawn from each lane's (clock, tokens) trace, which the
engine side records after every step, so the picture does not depend on when the screen redrew.
"""

from __future__ import annotations

from bisect import bisect_right

from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from tinyllm.race.views import LaneView
from tui.widgets.style import DIM, STATE_COLOURS, duration

BAND = 2  # lines per lane: 16 levels with eighth blocks
LABEL_W = 14
BLOCKS = " ▁▂▃▄▅▆▇█"
COLOURS = {
    "static": STATE_COLOURS["queued"],
    "continuous": STATE_COLOURS["finished"],
    "chunked": STATE_COLOURS["running"],
}
NAMES = {"static": "static", "continuous": "continuous", "chunked": "budget+cache"}


def lane_name(v: LaneView) -> str:
    """A lane's short name, as the chart labels it (and the race's status names the last to step)."""
    return NAMES.get(v.key, v.title)


PALETTE = ("#4363d8", "#f58231", "#3cb44b", "#911eb4", "#1fa8b8", "#e6194b")  # what-if lanes, in order


def tokens_at(trace: tuple[tuple[float, int], ...], t: float) -> float | None:
    """Tokens made by clock time ``t`` (linear between trace points); None past the trace's end."""
    times = [p[0] for p in trace]
    i = bisect_right(times, t)
    if i >= len(trace):
        return None if t > times[-1] + 1e-12 else float(trace[-1][1])
    if i == 0:
        return 0.0
    (t0, n0), (t1, n1) = trace[i - 1], trace[i]
    return n0 + (n1 - n0) * (t - t0) / (t1 - t0) if t1 > t0 else float(n1)


class RaceTrack(Widget):
    DEFAULT_CSS = "RaceTrack { height: auto; }"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.lanes: tuple[LaneView, ...] = ()

    def show(self, lanes: tuple[LaneView, ...]) -> None:
        if tuple(v.trace for v in lanes) != tuple(v.trace for v in self.lanes):
            resized = len(lanes) != len(self.lanes)
            self.lanes = lanes
            self.refresh(layout=resized)

    def get_content_height(self, container, viewport, width: int) -> int:
        return self.height_for(len(self.lanes))

    @staticmethod
    def height_for(lanes: int) -> int:
        """Its lines for ``lanes`` lanes: a title, a band each, the time axis."""
        return 1 + BAND * lanes + 1

    def render(self) -> Text:
        width = max(10, self.size.width - LABEL_W)
        end = max((v.trace[-1][0] for v in self.lanes), default=0.0)
        out = Text(no_wrap=True, overflow="crop")
        title = "tokens over each lane's own clock (the steeper, the faster; a band stops where its lane finished)"
        if len(title) > self.size.width - 2:
            title = "tokens over each lane's own clock (steeper: faster)"
        out.append(title + "\n", "bold")
        for i, v in enumerate(self.lanes):
            style = Style(color=COLOURS.get(v.key) or PALETTE[i % len(PALETTE)])
            levels = []
            for c in range(width):
                n = tokens_at(v.trace, end * (c + 1) / width) if end > 0 else None
                levels.append(None if n is None else round(BAND * 8 * n / max(1, v.total_tokens)))
            done = f"✓ {duration(v.result.wall_s)}" if v.finished else f"{v.tokens / max(1, v.total_tokens):.0%}"
            for row in range(BAND):
                label = lane_name(v) if row == 0 else f"  {done}"
                out.append(f"{label:<{LABEL_W - 1}} ", style if row == 0 else DIM)
                floor = (BAND - 1 - row) * 8
                out.append("".join(" " if lv is None else BLOCKS[max(0, min(8, lv - floor))] for lv in levels), style)
                out.append("\n")
        axis = f"0s{'':{max(1, width - 2 - len(duration(end)))}}{duration(end)}"
        out.append(" " * LABEL_W + axis, DIM)
        return out
