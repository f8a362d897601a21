"""A widget drawn in at most ``max_rows`` lines, the cap set by the app as the terminal resizes
(the block map, the prefix-cache map): a new cap lays the widget out again."""

from __future__ import annotations

from textual.widget import Widget


class RowCapped(Widget):
    def __init__(self, max_rows: int = 6, **kw):
        super().__init__(**kw)
        self._max_rows = max_rows

    @property
    def max_rows(self) -> int:
        return self._max_rows

    @max_rows.setter
    def max_rows(self, rows: int) -> None:
        if rows != self._max_rows:
            self._max_rows = rows
            self.refresh(layout=True)
