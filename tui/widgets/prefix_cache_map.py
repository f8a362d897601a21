"""A vLLM server's prefix cache, drawn from its KV-cache events as the block map draws ours.

One cell per cached block, grouped by chain: a tree of hash-linked blocks drawn depth first,
chains in the order their first block arrived with a space between them, each chain's colour
fixed by that order, ╎ where a fork's second (third, ...) branch begins. ■ a cached block, ▪ a partial one, ▣ a prefix several sequences share (a
fork: two or more continuations follow it), ▤ a duplicate (the same tokens cached in two or more
copies: requests that computed them apart), ◆ one on another medium (CPU offload), ✕ a block
evicted in the last few seconds, … before a chain whose first block's parent is not cached. When the cells do not fit in ``max_rows`` lines, one cell stands for several blocks of a
chain and the header says how many: every block stays on screen.

The widget draws exactly the ``CacheView`` it was given (the runner's frame carries it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text

from tui.widgets.row_capped import RowCapped
from tui.widgets.status import fit_fields
from tui.widgets.style import STATE_COLOURS, rid_style

if TYPE_CHECKING:  # msgspec loads only with --kv-events
    from tinyllm.observe.kv_events import CacheView, ChainView

GLYPHS = {"b": "■", "p": "▪", "s": "▣", "d": "▤", "o": "◆", "x": "✕", ",": "╎"}
EVICTED = Style(color=STATE_COLOURS["aborted"], bold=True)
LEGEND_ITEMS = ("■ block", "▪ partial", "▣ shared", "▤ dup", "◆ offloaded", "✕ evicted", "… prefix gone")
LEGEND = " ".join(LEGEND_ITEMS)


def squeeze(cells: str, per_cell: int) -> str:
    """A chain's cells, ``per_cell`` blocks to a cell: all evicted → x; any shared → s; any
    duplicate → d; any offloaded → o; all partial → p; else b."""
    if per_cell == 1:
        return cells
    cells = cells.replace(",", "")  # squeezed: no branch marks
    out = []
    for i in range(0, len(cells), per_cell):
        g = cells[i : i + per_cell]
        out.append(
            "x"
            if set(g) == {"x"}
            else "s"
            if "s" in g
            else "d"
            if "d" in g
            else "o"
            if "o" in g
            else "p"
            if set(g) == {"p"}
            else "b"
        )
    return "".join(out)


def layout(chains: tuple[ChainView, ...], width: int, max_rows: int) -> tuple[int, list[list[tuple[str, int]]]]:
    """(blocks per cell, rows of (cell letters, chain index) runs) so the chains fit ``max_rows``
    rows of ``width``; if even one cell per chain does not fit, the last rows are cut."""
    width = max(1, width)
    longest = max((len(c.cells) for c in chains), default=1)
    total = sum(len(c.cells) for c in chains)
    per_cell = max(1, -(-total // (width * max(1, max_rows))))
    while True:
        used = sum(c.partial + -(-len(c.cells) // per_cell) + 1 for c in chains)
        if -(-used // width) <= max_rows or per_cell >= longest:
            break
        per_cell += 1
    stream: list[tuple[str, int]] = []  # (letter or " " / "…", chain index)
    for c in chains:
        if c.partial:
            stream.append(("…", c.index))
        stream.extend((ch, c.index) for ch in squeeze(c.cells, per_cell))
        stream.append((" ", -1))
    rows = [stream[i : i + width] for i in range(0, len(stream), width)][: max(1, max_rows)]
    return per_cell, rows


class PrefixCacheMap(RowCapped):
    DEFAULT_CSS = "PrefixCacheMap { height: auto; min-height: 2; text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, max_rows: int = 6, endpoint: str = "", **kw):
        super().__init__(max_rows, **kw)
        self.view: CacheView | None = None
        self.endpoint = endpoint  # where the KV events come from (the title says it where it fits)

    def show(self, view: CacheView | None) -> None:
        if view != self.view:
            self.view = view
            self.refresh(layout=True)

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self.render_text(width).plain.splitlines()) or 1

    def render(self) -> Text:
        return self.render_text(self.size.width or 80)

    def header(self, per_cell: int, width: int = 1000) -> str:
        """Blocks, tokens, chains, shared, duplicates, evicted: the figures that fit ``width``,
        each whole (the blocks and tokens, and how many blocks a cell holds, always)."""
        v = self.view
        evicted = sum(c.cells.count("x") for c in v.chains)
        chains = sum(1 for c in v.chains if c.cells.strip("x"))
        size = f" × {v.block_size}" if v.block_size else ""
        return fit_fields(
            [
                (f"{v.blocks} blocks{size} · {v.tokens} tok", "", 0),
                (f" · {chains} chains", "", 3),
                (f" · ▣ {v.forks} shared", "", 1),
                (f" · ▤ {v.duplicates} dup", "", 4),
                (f" · ✕ {evicted} evicted", "", 2),
                *([(f" · {per_cell} blocks/cell", "", 0)] if per_cell > 1 else []),
            ],
            width,
        ).plain

    def counts(self, width: int = 1000) -> str:
        """The cache's state and its event counts (the highest ranks dropped first where ``width`` is short)."""
        v = self.view
        age = f" {v.last_event_age_s:.0f} s" if v.status in ("idle", "disconnected") and v.last_event_age_s else ""
        events = (
            ("batches", v.batches, 3),
            ("stored", v.stored, 1),
            ("removed", v.removed, 2),
            ("cleared", v.cleared, 4),
        )
        fields = [(f"{v.status}{age}", "", 0), *((f" · {n} {name}", "", rank) for name, n, rank in events)]
        return fit_fields(fields, width).plain

    def troubles(self) -> str:
        """What went wrong on the way, if anything: lost batches, restarts, unknown removals."""
        v = self.view
        return " · ".join(
            f"{n} {what}"
            for n, what in (
                (v.missed, "batches missed"),
                (v.restarts, "restarts"),
                (v.unknown_removed, "removed unseen"),
            )
            if n
        )

    def title(self, width: int) -> str:
        """The panel's title for a panel ``width`` cells wide: where the events come from, if it
        fits (the title was cut at 120 columns)."""
        where = self.endpoint
        for title in (
            f"vLLM prefix cache (KV events from {where})",
            f"vLLM prefix cache · {where}",
            "vLLM prefix cache (KV events)",
            "vLLM prefix cache",
        ):
            if cell_len(title) + 6 <= width:  # the corners and a space each side
                return title
        return "prefix cache"

    def on_resize(self, event) -> None:
        if self.endpoint:
            self.border_title = self.title(self.outer_size.width)

    def render_text(self, width: int) -> Text:
        """The panel as text: header, counts, the map, the legend (plain ``.plain`` for tests)."""
        v = self.view
        if v is None:
            return Text("no KV events yet", style="dim")
        t = Text(no_wrap=True, overflow="ellipsis")
        per_cell, rows = layout(v.chains, width, self._max_rows)
        t.append(self.header(per_cell, width) + "\n", style="bold")
        t.append(self.counts(width) + "\n", style="dim")
        if troubles := self.troubles():
            t.append(troubles + "\n", style="dim")
        if v.bad:
            t.append(f"{v.bad} bad messages", style=EVICTED)
            t.append(f": {v.last_error}\n", style="dim")
        if not v.chains:
            t.append(f"nothing cached yet: waiting for {v.endpoint}\n", style="dim italic")
        for row in rows:
            for letter, chain in row:
                glyph = GLYPHS.get(letter, letter)
                style = None if chain < 0 else EVICTED if letter == "x" else rid_style(chain)
                t.append(glyph, style=style)
            t.append("\n")
        t.append("\n".join(legend_lines(width)), style="dim")
        return t


def legend_lines(width: int) -> list[str]:
    """The legend on as many lines as ``width`` needs, broken between its items."""
    lines = [""]
    for item in LEGEND_ITEMS:
        if lines[-1] and cell_len(lines[-1]) + 1 + cell_len(item) > width:
            lines.append("")
        lines[-1] += (" " if lines[-1] else "") + item
    return lines
