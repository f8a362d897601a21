"""The event log: the newest scheduler events that fit, newest at the bottom.

A fixed-size tail view rather than a scrolling log: appending to a scrolling log changes its
virtual size, which costs a layout pass of the whole screen on every frame with events."""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.widget import Widget

from tui.runners.interface import LogEntry
from tui.widgets.style import EVENT_STYLES


class EventLog(Widget):
    DEFAULT_CSS = "EventLog { height: 1fr; text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, max_lines: int = 200, **kw):
        super().__init__(**kw)
        self.lines: deque[LogEntry] = deque(maxlen=max_lines)

    def reset(self, entries) -> None:
        """Show exactly ``entries`` (a replay went back in time)."""
        self.lines.clear()
        self.lines.extend(entries)
        self.refresh()

    def add(self, entries: list[LogEntry]) -> None:
        if entries:
            self.lines.extend(entries)
            self.refresh()

    def render(self) -> Text:
        height = max(1, self.content_region.height)
        out = Text(no_wrap=True, overflow="ellipsis")
        for i, e in enumerate(list(self.lines)[-height:]):
            if i:
                out.append("\n")
            out.append(f"{e.step:>6} ", style="dim")
            out.append(e.text, style=EVENT_STYLES.get(e.kind))
        return out
