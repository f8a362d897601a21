"""PgUp / PgDn / Home / End, the same in every widget that shows a long list a page at a time (the
event log, the panes): one binding table, and each widget says what a page, the first and the
last are for it."""

from __future__ import annotations

from textual.binding import Binding
from textual.widget import Widget


class PagedWidget(Widget):
    """A widget whose content is turned a page at a time: it defines ``action_page(direction)``
    (-1: PgUp, towards the start; +1: PgDn), ``action_first`` (Home) and ``action_last`` (End)."""

    BINDINGS = [
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "first", "To the start", show=False),
        Binding("end", "last", "To the end", show=False),
    ]

    def action_page(self, direction: int) -> None:
        raise NotImplementedError

    def action_first(self) -> None:
        raise NotImplementedError

    def action_last(self) -> None:
        raise NotImplementedError
