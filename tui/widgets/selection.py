"""What the request list and the timeline share: the keys that move the selection, and the
message they post when the user moves it (the app selects that request in every panel)."""

from __future__ import annotations

from textual.binding import Binding
from textual.message import Message

SELECT_BINDINGS = [
    Binding("up", "move(-1)", "Previous request", show=False),
    Binding("down", "move(1)", "Next request", show=False),
    Binding("home", "move_to(0)", "First request", show=False),
    Binding("end", "move_to(-1)", "Last request", show=False),
]


class RequestSelected(Message):
    """The user moved the selection to request ``rid``."""

    def __init__(self, rid: int) -> None:
        super().__init__()
        self.rid = rid
