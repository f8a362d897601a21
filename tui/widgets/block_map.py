"""The paged pool: one character per KV block, coloured by the request that owns it.

Line API (like the slot grid): each line is built straight from the block owners as a few
segments (runs of blocks with the same owner share one), because the map changes every step
while the engine runs and a Rich ``Text`` with one span per block cost ~7 ms a frame.
"""

from __future__ import annotations

from itertools import groupby

from rich.segment import Segment
from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget

from tinyllm.snapshot import EngineSnapshot
from tui.widgets.style import DIM, on, rid_style


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
        n = len(self.snapshot.kv.block_owner) if self.snapshot else 0
        return 1 + -(-n // max(1, width))

    def _header(self) -> str:
        kv = self.snapshot.kv
        return f"{kv.n_blocks - kv.free_blocks}/{kv.n_blocks} owned"

    def render_line(self, y: int) -> Strip:
        width, base = self.size.width, self.rich_style
        if self.snapshot is None or not self.snapshot.kv.block_owner:
            return Strip.blank(width, base)
        if y == 0:
            return Strip([Segment(self._header(), on(base, DIM))]).crop_extend(0, width, base)
        owners = self.snapshot.kv.block_owner[(y - 1) * width:y * width]
        segments = [Segment(("·" if owner is None else "■") * len(list(run)),
                            on(base, DIM if owner is None else rid_style(owner)))
                    for owner, run in groupby(owners)]
        return Strip(segments).crop_extend(0, width, base)

    def render(self) -> Text:                         # plain text of the map (tests, copy-out)
        if self.snapshot is None or not self.snapshot.kv.block_owner:
            return Text("")
        marks = "".join("·" if o is None else "■" for o in self.snapshot.kv.block_owner)
        return Text(f"{self._header()}\n{marks}")
