"""The event log: scheduler events, newest at the bottom, each wrapped; it scrolls back.

The log keeps the run's last ``HISTORY`` entries in memory (the runner's frames carry only their
newest 500), so a live session can be read back without ``--record``: focused (Tab, a click, or
``e``), ↑ / ↓, PgUp / PgDn and Home / End move through it, as does the mouse wheel over it; End
(or ↓ to the bottom) follows the newest again. Scrolled back, the view stays on the same entries
while new ones arrive, and its bottom border says how many are below.

A fixed-size view drawn from an offset rather than a scrolling container: appending to a
scrolling log changes its virtual size, which costs a layout pass of the whole screen on every
frame with events. Drawing walks back from the bottom entry shown, so it costs the panel's height,
not the history's length.
"""

from __future__ import annotations

import textwrap
from collections import deque
from itertools import islice

from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual.binding import Binding

from tui.runners.interface import LogEntry
from tui.widgets.paging import PagedWidget
from tui.widgets.style import EVENT_STYLES

STEP_W = 7  # the step column: six digits and a space
HISTORY = 10_000  # entries kept for scrolling back: the oldest go first


class EventLog(PagedWidget, can_focus=True):
    DEFAULT_CSS = "EventLog { height: 1fr; text-wrap: nowrap; text-overflow: ellipsis; }"
    BINDINGS = [
        Binding("up", "scroll_back(1)", "Older event", show=False),
        Binding("down", "scroll_back(-1)", "Newer event", show=False),
    ]  # (PgUp / PgDn, Home / End: PagedWidget's; the oldest entries are at the start)

    def __init__(self, max_lines: int = HISTORY, **kw):
        super().__init__(**kw)
        self.lines: deque[LogEntry] = deque(maxlen=max_lines)
        self.below = 0  # entries newer than the bottom one shown (0: the view follows the newest)

    # -- what it holds ------------------------------------------------------------------------------
    def reset(self, entries) -> None:
        """Show exactly ``entries`` (a replay went back in time, a server restarted)."""
        self.lines.clear()
        self.lines.extend(entries)
        self.below = 0
        self._changed()

    def add(self, entries: list[LogEntry]) -> None:
        if entries:
            self.lines.extend(entries)
            if self.below:  # scrolled back: the same entries stay in view
                self.below = min(self.below + len(entries), len(self.lines) - 1)
            self._changed()

    # -- scrolling ---------------------------------------------------------------------------------
    def scroll_back(self, n: int) -> None:
        """``n`` entries further back (negative: towards the newest), within what is kept."""
        below = max(0, min(len(self.lines) - 1, self.below + n))
        if below != self.below:
            self.below = below
            self._changed()

    def action_scroll_back(self, n: int) -> None:
        self.scroll_back(n)

    def action_page(self, direction: int) -> None:
        self.scroll_back(-direction * max(1, self.content_region.height - 1))  # (PgUp: older)

    def action_first(self) -> None:
        """Back to the oldest entry kept: the bottom entry shown is the one that fills the view."""
        height, width = self._area()
        shown, below = 0, len(self.lines) - 1
        for e in self.lines:
            shown += len(entry_lines(e, width))
            if shown >= height:
                break
            below -= 1
        self.scroll_back(max(0, below) - self.below)

    def action_last(self) -> None:
        """The newest entry, and follow the new ones."""
        self.scroll_back(-self.below)

    def _on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        event.stop()
        self.scroll_back(3)

    def _on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        event.stop()
        self.scroll_back(-3)

    def _changed(self) -> None:
        """Repaint, and say in the bottom border where the view is when it is not at the end."""
        said = ""
        if self.below:  # the longest that fits the border
            room = self.outer_size.width - 6
            said = next(
                (
                    s
                    for s in (
                        f"↓ {self.below:,} newer · End: follow · {len(self.lines):,} kept (last {self.lines.maxlen:,})",
                        f"↓ {self.below:,} newer · End: follow",
                    )
                    if cell_len(s) <= room
                ),
                f"↓ {self.below:,} newer",
            )
        if self.border_subtitle != said:
            self.border_subtitle = said
        self.refresh()

    # -- drawing ------------------------------------------------------------------------------------
    def _area(self) -> tuple[int, int]:
        return max(1, self.content_region.height), max(20, self.content_region.width)

    def visible(self) -> list[LogEntry]:
        """The entries on screen now (tests, and what the user reads), oldest first."""
        height, width = self._area()
        shown, out = 0, []
        for e in islice(reversed(self.lines), self.below, None):
            out.insert(0, e)
            shown += len(entry_lines(e, width))
            if shown >= height:
                break
        return out

    def render(self) -> Text:
        """The entries that fit above the bottom one shown (the newest, unless scrolled back),
        each wrapped under its text (a scheduler's "waits: ..." is the why a user came to read:
        cut to the panel's width it lost its end)."""
        height, width = self._area()
        lines: list[Text] = []
        for e in islice(reversed(self.lines), self.below, None):
            lines[:0] = entry_lines(e, width)
            if len(lines) >= height:
                break
        out = Text(no_wrap=True, overflow="ellipsis")
        out.append(Text("\n").join(lines[-height:]))
        return out


def entry_lines(e: LogEntry, width: int) -> list[Text]:
    """One entry as lines of ``width``: its step, then its text, wrapped at words under itself."""
    style = EVENT_STYLES.get(e.kind)
    lines = []
    for i, chunk in enumerate(textwrap.wrap(e.text, width - STEP_W) or [""]):
        line = Text(f"{e.step:>{STEP_W - 1}} " if i == 0 else " " * STEP_W, style="dim")
        line.append(chunk, style=style)
        lines.append(line)
    return lines
