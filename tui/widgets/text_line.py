"""A one-line text widget that repaints only itself."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget


class TextLine(Widget):
    """One fixed-height line of Rich Text. Updating it repaints only itself (a Static's update()
    asks for a layout pass of the whole screen, which is what made every frame expensive)."""

    DEFAULT_CSS = "TextLine { height: 1; }"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.text = Text()

    def set(self, text: Text) -> None:
        if text != self.text:
            self.text = text
            self.refresh()

    def render(self) -> Text:
        return self.text
