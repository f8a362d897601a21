"""The paged pool: one character per KV block, coloured by the request that owns it."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from tinyllm.snapshot import EngineSnapshot
from tui.widgets.style import rid_style


class BlockMap(Widget):
    DEFAULT_CSS = "BlockMap { height: auto; min-height: 1; }"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.snapshot: EngineSnapshot | None = None

    def show(self, snapshot: EngineSnapshot) -> None:
        resized = self.snapshot is None or snapshot.kv.n_blocks != self.snapshot.kv.n_blocks
        changed = resized or snapshot.kv.block_owner != self.snapshot.kv.block_owner
        self.snapshot = snapshot
        if changed:
            self.refresh(layout=resized)              # a new pool size needs a new height

    def get_content_height(self, container, viewport, width: int) -> int:
        n = len(self.snapshot.kv.block_owner) + 14 if self.snapshot else 1
        return max(1, -(-n // max(1, width)))

    def render(self) -> Text:
        if self.snapshot is None or not self.snapshot.kv.block_owner:
            return Text("")
        kv = self.snapshot.kv
        out = Text(no_wrap=False, overflow="fold")
        out.append(f"{kv.n_blocks - kv.free_blocks}/{kv.n_blocks} owned ", style="dim")
        for owner in kv.block_owner:
            if owner is None:
                out.append("·", style="dim")
            else:
                out.append("■", style=rid_style(owner))
        return out
