"""The event log: the newest scheduler events that fit, newest at the bottom, each wrapped.

A fixed-size tail view rather than a scrolling log: appending to a scrolling log changes its
virtual size, which costs a layout pass of the whole screen on every frame with events."""

from __future__ import annotations

import textwrap
from collections import deque

from rich.text import Text
from textual.widget import Widget

from tui.runners.interface import LogEntry
from tui.widgets.style import EVENT_STYLES

STEP_W = 7  # the step column: six digits and a space


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
        """The newest entries that fit, each wrapped under its text (a scheduler's "waits: ..."
        is the why a user came to read: cut to the panel's width it lost its end)."""
        height, width = max(1, self.content_region.height), max(20, self.content_region.width)
        lines: list[Text] = []
        for e in reversed(self.lines):
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
