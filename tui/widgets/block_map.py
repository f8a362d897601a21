"""The paged pool: one character per KV block, coloured by the request that owns it.

When the pool does not fit in ``max_rows`` lines (a small terminal, a big pool), one cell
stands for several blocks and the header says how many: every block is always on screen.

Line API (like the slot grid): each line is built straight from the block owners as a few
segments (runs of blocks with the same owner share one), because the map changes every step
while the engine runs and a Rich ``Text`` with one span per block cost ~7 ms a frame.
"""

from __future__ import annotations

from itertools import groupby

from rich.segment import Segment
from rich.text import Text
from textual.strip import Strip

from tinyllm.observe.snapshot import EngineSnapshot
from tui.widgets.row_capped import RowCapped
from tui.widgets.style import CACHED, DIM, on, rid_style


class BlockMap(RowCapped):
    DEFAULT_CSS = "BlockMap { height: auto; min-height: 1; }"

    def __init__(self, max_rows: int = 6, **kw):
        super().__init__(max_rows, **kw)
        self.snapshot: EngineSnapshot | None = None

    def per_cell(self, width: int) -> int:
        """Blocks one cell stands for, so the whole pool fits in ``max_rows`` lines."""
        n = len(self.snapshot.kv.block_owner) if self.snapshot else 0
        return max(1, -(-n // (max(1, width) * max(1, self._max_rows))))

    def show(self, snapshot: EngineSnapshot) -> None:
        resized = self.snapshot is None or snapshot.kv.n_blocks != self.snapshot.kv.n_blocks
        changed = resized or self._changed(snapshot, self.snapshot)
        self.snapshot = snapshot
        if changed:
            self.refresh(layout=resized)  # a new pool size needs a new height

    def get_content_height(self, container, viewport, width: int) -> int:
        n = len(self.snapshot.kv.block_owner) if self.snapshot else 0
        return 1 + -(-n // (max(1, width) * self.per_cell(width)))

    def _changed(self, a: EngineSnapshot, b: EngineSnapshot) -> bool:
        return (a.kv.block_owner, a.kv.block_refs, a.kv.block_cached) != (
            b.kv.block_owner,
            b.kv.block_refs,
            b.kv.block_cached,
        )

    def _header(self, per_cell: int) -> str:
        kv = self.snapshot.kv
        shared = sum(1 for r in kv.block_refs if r > 1)
        head = f"{kv.n_blocks - kv.free_blocks}/{kv.n_blocks} owned"
        if per_cell > 1:  # squeezed: say it, and briefly
            head = f"{kv.n_blocks - kv.free_blocks}/{kv.n_blocks} owned · {per_cell} blocks/cell"
            return head + (f" · ▣{shared} ○{kv.cached_free_blocks}" if kv.block_cached else "")
        if kv.block_cached:
            head += f"  ▣ shared {shared}  ○ cached {kv.cached_free_blocks}"
        return head

    def _marks(self, per_cell: int = 1) -> list[tuple[str, object]]:
        """(glyph, owner rid or a marker) per cell: runs of equal pairs become one segment. A
        cell of several blocks takes the colour of its most common owner; ■ all owned, ▪ some."""
        kv = self.snapshot.kv
        refs = kv.block_refs or (0,) * len(kv.block_owner)
        cached = kv.block_cached or (False,) * len(kv.block_owner)
        blocks = list(zip(kv.block_owner, refs, cached))
        out = []
        for i in range(0, len(blocks), per_cell):
            group = blocks[i : i + per_cell]
            owners = [o for o, _, _ in group if o is not None]
            if not owners:
                out.append(("○", "cached") if any(c for _, _, c in group) else ("·", None))
                continue
            top = max(set(owners), key=lambda o: (owners.count(o), -o))
            glyph = (
                "▣" if any(r > 1 for o, r, _ in group if o is not None) else "■" if len(owners) == len(group) else "▪"
            )
            out.append((glyph, top))
        return out

    def render_line(self, y: int) -> Strip:
        width, base = self.size.width, self.rich_style
        if self.snapshot is None or not self.snapshot.kv.block_owner:
            return Strip.blank(width, base)
        per_cell = self.per_cell(width)
        if y == 0:
            return Strip([Segment(self._header(per_cell), on(base, DIM))]).crop_extend(0, width, base)
        marks = self._marks(per_cell)[(y - 1) * width : y * width]
        segments = [
            Segment(
                glyph * len(list(run)), on(base, DIM if who is None else CACHED if who == "cached" else rid_style(who))
            )
            for (glyph, who), run in groupby(marks)
        ]
        return Strip(segments).crop_extend(0, width, base)

    def render(self) -> Text:  # plain text of the map (tests, copy-out)
        if self.snapshot is None or not self.snapshot.kv.block_owner:
            return Text("")
        per_cell = self.per_cell(self.size.width or 80)
        marks = "".join(glyph for glyph, _ in self._marks(per_cell))
        return Text(f"{self._header(per_cell)}\n{marks}")
