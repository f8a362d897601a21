"""One race lane: its rows (batch rows or slots), progress, clock, TTFT, KV and row use.

A row's cell: ``03 #12  ███░░  40`` = slot / batch row 3 holds request 12, which has generated 40
tokens (the bar: of its max_new_tokens; cyan with ``▸`` while its prompt is prefilled in chunks).
``wasted``: static batching, finished but still computed until its batch's longest row is done."""

from __future__ import annotations

import textwrap

from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from tinyllm.race.views import LaneView, RowView
from tui.widgets.style import DIM, STATE_STYLES, bar, duration, rid_style

CELL_W = 18  # "03 #12  █████ 140 " like the app's slot grid
SMALL_W = 9  # " 12 ████ " when room is short
MAX_LINES = 6  # lines of rows in a panel (2 when compact) before they are summarised
WASTED = Style(color="#d03a3a", dim=True)
BOLD = Style(bold=True)


def _pairs(pairs: list[tuple[str, str]]) -> Text:
    """``label value  label value`` on one line (labels dim, values bold)."""
    t = Text(no_wrap=True, overflow="ellipsis")
    for label, val in pairs:
        t.append(f"{label} ", DIM)
        t.append(f"{val}  ", BOLD)
    return t


def cell(i: int, row: RowView, small: bool) -> list[tuple[str, Style]]:
    """One row's cell, exactly CELL_W (or SMALL_W) wide."""
    running = STATE_STYLES["prefill" if row.state == "prefill" else "running"]
    fill = row.progress / max(1, row.goal)
    if small:
        if row.rid is None:
            return [("  · ···· ", DIM)]
        rid = (f"{row.rid:>3}", rid_style(row.rid))
        if row.state == "wasted":
            return [rid, (" ×××× ", WASTED)]
        if row.state == "done":
            return [rid, (" ✓    ", STATE_STYLES["finished"])]
        return [rid, (" ", DIM), (bar(fill, 4, empty="▹" if row.state == "prefill" else "░"), running), (" ", DIM)]
    head = (f"{i:02d} ", DIM)
    if row.rid is None:
        return [head, ("free".ljust(CELL_W - 3), DIM)]
    rid = (f"#{row.rid:<3}", rid_style(row.rid))
    if row.state == "wasted":
        return [head, rid, (" wasted".ljust(CELL_W - 7), WASTED)]
    if row.state == "done":
        return [head, rid, (" ✓ done".ljust(CELL_W - 7), STATE_STYLES["finished"])]
    mark = "▸" if row.state == "prefill" else " "
    return [
        head,
        rid,
        (mark, running),
        (bar(fill, 5, empty="▹" if row.state == "prefill" else "░"), running),
        (f" {row.progress:>3} ", DIM),
    ]


class LanePanel(Widget):
    """A lane's panel. ``compact``: a short screen (80x24): small cells when the full ones would
    take more than two lines, fewer lines of figures, no rows once the lane is done."""

    DEFAULT_CSS = "LanePanel { height: auto; text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.view: LaneView | None = None
        self.compact = False
        self.min_lines = 0  # side by side, every lane is as tall as the tallest
        self._height = 0  # the content height the layout last gave it

    def show(self, view: LaneView, compact: bool) -> None:
        if view != self.view or compact != self.compact:
            self.view, self.compact = view, compact
            self.border_title = self._title(view)
            self.border_subtitle = self._subtitle(view)
            width = self.content_region.width
            # a new line count needs a new height (a lane whose busy rows grow past a line of cells
            # kept its old height and lost its progress bar)
            self.refresh(layout=not width or max(1, self.min_lines, len(self.lines(width))) != self._height)

    @staticmethod
    def _title(v: LaneView) -> str:
        """The lane's name, then what it can run at once and its KV memory (``· 64 seqs · 32 MiB``:
        at equal memory, why the paged lanes run more). On top: a short screen has no bottom border."""
        return v.title if v.kv_mib is None else f"{v.title} · {v.capacity}"

    @staticmethod
    def _subtitle(v: LaneView) -> str:
        return f"✓ finished at {duration(v.result.wall_s)}" if v.finished else ""

    def _grid(self, width: int) -> list[Text]:
        """The rows, full cells; small ones when full cells would take more than MAX_LINES (2
        when compact); past that, the busy rows first and ``+N`` for the rest (a lane at a KV
        budget may run 64 sequences)."""
        v = self.view
        if v is None or (self.compact and v.finished):
            return []
        limit = 2 if self.compact else MAX_LINES
        rows = list(enumerate(v.rows))
        small = False
        per_row = max(1, width // CELL_W)
        if -(-len(rows) // per_row) > limit:
            small, per_row = True, max(1, width // SMALL_W)
        more = None
        if -(-len(rows) // per_row) > limit:
            rows.sort(key=lambda ir: ir[1].rid is None)  # stable: busy rows first, in slot order
            shown = max(0, limit * per_row - min(2, per_row))  # room for the +N note
            hidden = rows[shown:]
            busy = sum(r.rid is not None for _, r in hidden)
            more = Text(f" +{len(hidden)}" + (f" ({busy} busy)" if busy else " free"), style=DIM)
            rows = rows[:shown]
        lines = []
        for start in range(0, len(rows), per_row):
            line = Text(no_wrap=True, overflow="crop")
            for i, row in rows[start : start + per_row]:
                for text, style in cell(i, row, small):
                    line.append(text, style)
            lines.append(line)
        if more is not None:
            if lines and len(lines) == limit:
                lines[-1].append_text(more)
            else:
                lines.append(more)
        return lines

    def _figures(self, width: int) -> list[Text]:
        v = self.view
        if v is None:
            return []
        frac = v.tokens / max(1, v.total_tokens)
        progress = Text(no_wrap=True, overflow="ellipsis")
        tail = f" {frac:4.0%}  done {v.done}/{v.total}  clock {duration(v.clock_s)}"
        progress.append(
            bar(frac, max(4, min(40, width - len(tail) - 1))), STATE_STYLES["finished" if v.finished else "running"]
        )
        progress.append(tail, BOLD)
        kv = v.kv_used / v.kv_reserved if v.kv_reserved else 0.0
        speed = [
            ("TTFT p50", duration(v.ttft_p50_s)),
            ("rows used", f"{v.row_util:.0%}"),
            ("steps", f"{v.decode_steps:,}"),
        ]
        load = [
            ("KV", f"{bar(kv, 6)} {kv:.0%}"),
            *((("queue", str(v.queued)),) if v.queued else ()),
            *((("arriving", str(v.arriving)),) if v.arriving else ()),
        ]
        if self.compact:
            lines = [progress, _pairs(speed + load)]
            return lines + ([Text(v.note, style="yellow", no_wrap=True, overflow="ellipsis")] if v.note else [])
        load.append(("tokens", f"{v.tokens:,}/{v.total_tokens:,}"))
        detail = f"{v.detail} · {v.kernels}" if v.kernels else v.detail  # (which scheduler, which kernels)
        about = [Text(line, style="dim italic") for line in textwrap.wrap(detail, max(20, width))]
        note = [Text(v.note, style="yellow", no_wrap=True, overflow="ellipsis")] if v.note else []
        return [*about, progress, _pairs(speed), _pairs(load), *note]

    def lines(self, width: int) -> list[Text]:
        return self._grid(width) + self._figures(width)

    def pad_to(self, n: int) -> None:
        if n != self.min_lines:
            self.min_lines = n
            self.refresh(layout=True)

    def get_content_height(self, container, viewport, width: int) -> int:
        self._height = max(1, self.min_lines, len(self.lines(width)))
        return self._height

    def render(self) -> Text:
        if self.view is None:
            return Text("starting…", style="dim")
        return Text("\n", no_wrap=True, overflow="ellipsis").join(self.lines(self.size.width))
