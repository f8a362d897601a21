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
from tui.widgets.style import CACHED, DIM, on, rid_style


class BlockMap(Widget):
    DEFAULT_CSS = "BlockMap { height: auto; min-height: 1; }"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.snapshot: EngineSnapshot | None = None

    def show(self, snapshot: EngineSnapshot) -> None:
        resized = self.snapshot is None or snapshot.kv.n_blocks != self.snapshot.kv.n_blocks
        changed = resized or self._changed(snapshot, self.snapshot)
        self.snapshot = snapshot
        if changed:
            self.refresh(layout=resized)              # a new pool size needs a new height

    def get_content_height(self, container, viewport, width: int) -> int:
        n = len(self.snapshot.kv.block_owner) if self.snapshot else 0
        return 1 + -(-n // max(1, width))

    def _changed(self, a: EngineSnapshot, b: EngineSnapshot) -> bool:
        return (a.kv.block_owner, a.kv.block_refs, a.kv.block_cached) != (b.kv.block_owner, b.kv.block_refs,
                                                                          b.kv.block_cached)

    def _header(self) -> str:
        kv = self.snapshot.kv
        shared = sum(1 for r in kv.block_refs if r > 1)
        head = f"{kv.n_blocks - kv.free_blocks}/{kv.n_blocks} owned"
        if kv.block_cached:
            head += f"  ▣ shared {shared}  ○ cached {kv.cached_free_blocks}"
        return head

    def _marks(self) -> list[tuple[str, object]]:
        """(glyph, owner rid or a marker) per block: runs of equal pairs become one segment."""
        kv = self.snapshot.kv
        refs = kv.block_refs or (0,) * len(kv.block_owner)
        cached = kv.block_cached or (False,) * len(kv.block_owner)
        out = []
        for owner, r, c in zip(kv.block_owner, refs, cached):
            if owner is None:
                out.append(("○", "cached") if c else ("·", None))
            else:
                out.append(("▣" if r > 1 else "■", owner))
        return out

    def render_line(self, y: int) -> Strip:
        width, base = self.size.width, self.rich_style
        if self.snapshot is None or not self.snapshot.kv.block_owner:
            return Strip.blank(width, base)
        if y == 0:
            return Strip([Segment(self._header(), on(base, DIM))]).crop_extend(0, width, base)
        marks = self._marks()[(y - 1) * width:y * width]
        segments = [Segment(glyph * len(list(run)), on(base, DIM if who is None else CACHED if who == "cached"
                                                       else rid_style(who)))
                    for (glyph, who), run in groupby(marks)]
        return Strip(segments).crop_extend(0, width, base)

    def render(self) -> Text:                         # plain text of the map (tests, copy-out)
        if self.snapshot is None or not self.snapshot.kv.block_owner:
            return Text("")
        marks = "".join(glyph for glyph, _ in self._marks())
        return Text(f"{self._header()}\n{marks}")
