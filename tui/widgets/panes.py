"""The panes view: one pane per KV slot, each streaming its request's text, tiled to fit.

A line-API widget (like the request list): the whole grid is one widget that draws each screen
line from cached strips, and a frame repaints only the panes whose request changed (their
regions), so drawing stays cheap however many panes there are. Text is wrapped as it grows
(``panes_text.Wrapped``) and drawn as plain segments, never markup. Which request a pane shows
comes from the frame alone (``panes_model``); this module draws them and moves the selection.

With more panes than fit at a readable size, the view pages (PgUp / PgDn) and its first line
says how many are off screen. The selected request's pane has a heavy frame; ←↑↓→ or a click
select another, Enter opens it in the list view.
"""

from __future__ import annotations

from functools import lru_cache

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Region
from textual.message import Message
from textual.strip import Strip

from tui.runners.interface import Frame
from tui.widgets.paging import PagedWidget
from tui.widgets.panes_draw import PaneDrawing, PaneKey, fit
from tui.widgets.panes_model import Pane, panes_of
from tui.widgets.panes_text import Wrapped
from tui.widgets.selection import RequestSelected
from tui.widgets.style import DIM, PLAIN, STATE_STYLES, on

MIN_W, MIN_H = 30, 5  # the smallest readable pane: 26 cells of text by 3 lines
HEADER = 1  # the summary line above the grid
HINTS = {
    "live": "No request holds a slot yet. Type a prompt (i) or load prompts (o): each request "
    "streams into a pane here while it runs. p: back to the list view.",
    "replay": "No request holds a slot at this step. space plays the recording, n steps on; p: back to the list view.",
    "server": "No request yet. Type a prompt (i): each request streams into a pane here while it "
    "runs. p: back to the list view.",
}


class PaneOpened(Message):
    """Enter on a pane: show request ``rid`` in the list view."""

    def __init__(self, rid: int) -> None:
        super().__init__()
        self.rid = rid


@lru_cache(maxsize=64)
def tile(n: int, width: int, height: int) -> tuple[int, int]:
    """(columns, rows) for ``n`` panes in ``width`` x ``height`` cells: as many panes as fit at
    MIN_W x MIN_H or more, then the most text per pane, where lines of 40 to 60 cells read best
    (narrower ones break too often; wider ones only cost the pane its lines)."""
    best, pick = None, (1, 1)
    for cols in range(1, max(1, width // MIN_W) + 1):
        rows = max(1, min(max(1, height // MIN_H), -(-max(1, n) // cols)))
        line, lines = max(0, width // cols - 4), max(0, height // rows - 2)
        score = (min(n, cols * rows), min(line, 60) * lines * min(1.0, line / 40), -cols)
        if best is None or score > best:
            best, pick = score, (cols, rows)
    return pick


class PanesView(PagedWidget, can_focus=True):
    """Every slot's request as it writes (see the module's docstring)."""

    COMPONENT_CLASSES = {"panes--header"}
    DEFAULT_CSS = """
    PanesView {
        height: 1fr;
        background: $surface;
        color: $foreground;
        & > .panes--header { background: $panel; color: $foreground; }
    }
    """
    BINDINGS = [
        Binding("left", "move(-1, 0)", "Pane to the left", show=False),
        Binding("right", "move(1, 0)", "Pane to the right", show=False),
        Binding("up", "move(0, -1)", "Pane above", show=False),
        Binding("down", "move(0, 1)", "Pane below", show=False),
    ]  # (PgUp / PgDn, Home / End: PagedWidget's, a page of panes at a time)

    def __init__(self, mode: str = "live", **kw) -> None:
        super().__init__(**kw)
        self.mode = mode  # "live", "replay" or "server": what the empty view's hint says
        self.frame: Frame | None = None
        self.panes: tuple[Pane, ...] = ()
        self.selected: int | None = None
        self.page = 0
        self._drawings: dict[int, PaneDrawing] = {}  # lane → its drawing
        self._geometry: tuple | None = None
        self._header: tuple[tuple, Strip] | None = None

    # -- data ------------------------------------------------------------------------------------
    def show(self, frame: Frame, selected: int | None) -> None:
        """Draw ``frame``: repaint the panes whose request, text or mark changed, all of them when
        the panes or the page changed."""
        panes = panes_of(frame)
        lanes_changed = [p.lane for p in panes] != [p.lane for p in self.panes]
        self.frame, self.panes, self.selected = frame, panes, selected
        self._clamp_page()
        if lanes_changed:
            self.refresh()
            return
        self._refresh_changed()

    def mark(self, selected: int | None) -> None:
        """Move the heavy frame to ``selected``'s pane."""
        if selected != self.selected:
            self.selected = selected
            self._refresh_changed()

    def visible(self) -> tuple[Pane, ...]:
        """The panes on screen now (this page's), in order."""
        per = self.per_page()
        return self.panes[self.page * per : (self.page + 1) * per]

    def per_page(self) -> int:
        cols, rows = self._tiling()
        return cols * rows

    def pages(self) -> int:
        return max(1, -(-len(self.panes) // self.per_page()))

    def off_screen(self) -> int:
        return len(self.panes) - len(self.visible())

    def pane_lines(self, lane: int) -> list[str]:
        """A visible pane's lines as drawn (frame included), plain text: tests and copy-out."""
        for i, p in enumerate(self.visible()):
            if p.lane == lane:
                return ["".join(s.text for s in strip) for strip in self._pane_strips(i, p)]
        raise KeyError(f"lane {lane} is not on screen")

    def header_text(self) -> str:
        return "".join(s.text for s in self._header_strip(self.size.width))

    def _clamp_page(self) -> None:
        self.page = max(0, min(self.page, self.pages() - 1))

    def _refresh_changed(self) -> None:
        width = self.size.width
        if self._header is not None and self._header_key(width) != self._header[0]:
            self.refresh(Region(0, 0, width, HEADER))
        for i, p in enumerate(self.visible()):
            d = self._drawings.get(p.lane)
            if d is None or d.key != self._pane_key(i, p):
                self.refresh(self._cell(i))

    # -- geometry ----------------------------------------------------------------------------------
    def _tiling(self) -> tuple[int, int]:
        return tile(len(self.panes), self.size.width, max(1, self.size.height - HEADER))

    def _cell(self, i: int) -> Region:
        """Where the page's ``i``-th pane is drawn (content coordinates)."""
        cols, rows = self._tiling()
        width, height = self.size.width, max(1, self.size.height - HEADER)
        c, r = i % cols, i // cols
        x0, x1 = c * width // cols, (c + 1) * width // cols
        y0, y1 = r * height // rows, (r + 1) * height // rows
        return Region(x0, HEADER + y0, x1 - x0, y1 - y0)

    def _index_at(self, x: int, y: int) -> int | None:
        for i in range(len(self.visible())):
            if self._cell(i).contains(x, y):
                return i
        return None

    # -- drawing (line API) ------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        if y < HEADER:
            return self._header_strip(width)
        shown = self.visible()
        if not shown:
            return self._hint_line(y - HEADER, width)
        cols, _ = self._tiling()
        row = next((i // cols for i in range(0, len(shown), cols) if self._cell(i).contains(0, y)), None)
        if row is None:
            return Strip.blank(width, base)
        parts = []
        for c in range(cols):
            i = row * cols + c
            cell = self._cell(i)
            if i < len(shown):
                parts.append(self._pane_strips(i, shown[i])[y - cell.y])
            else:
                parts.append(Strip.blank(cell.width, base))
        return Strip.join(parts).crop_extend(0, width, base)

    def _pane_key(self, i: int, p: Pane) -> PaneKey:
        f, rid, cell = self.frame, p.rid, self._cell(i)
        if f is None or p.view is None:
            return PaneKey(p, "", "", cell.width, cell.height, False, None)
        tps = p.view.tokens_per_s(f.snapshot.time_s) if p.holds else None
        return PaneKey(
            p, f.prompts.get(rid, ""), f.texts.get(rid, ""), cell.width, cell.height, rid == self.selected, tps
        )

    def _pane_strips(self, i: int, p: Pane) -> list[Strip]:
        d = self._drawings.get(p.lane)
        if d is None:
            d = self._drawings[p.lane] = PaneDrawing()
        return d.strips_for(self._pane_key(i, p), self.rich_style)

    def _header_key(self, width: int) -> tuple:
        return (self.frame.seq if self.frame else None, self.page, len(self.panes), self.per_page(), width)

    def _header_strip(self, width: int) -> Strip:
        key = self._header_key(width)
        if self._header is not None and self._header[0] == key:
            return self._header[1]
        style = on(self.rich_style, self.get_component_rich_style("panes--header"))
        fields: list[tuple[str, Style, int]] = []
        snap = self.frame.snapshot if self.frame else None
        if snap is not None:
            counts: dict[str, int] = {}
            for p in self.panes:
                if p.holds:
                    counts[p.state] = counts.get(p.state, 0) + 1
            waiting = {s: sum(v.state == s for v in snap.requests) for s in ("preempted", "queued")}
            if snap.slots:
                fields.append((f"{snap.num_requests_running}/{snap.n_slots} slots held", PLAIN, 0))
            for state in ("running", "prefill"):
                if counts.get(state):
                    fields.append((f"{counts[state]} {state}", STATE_STYLES[state], 2))
            for state, n in waiting.items():
                if n and snap.slots:
                    fields.append((f"{n} {state}", STATE_STYLES[state], 3))
        off = self.off_screen()
        if off:
            first = self.page * self.per_page() + 1
            fields.append((f"panes {first}–{first + len(self.visible()) - 1} of {len(self.panes)}", PLAIN, 1))
            fields.append((f"{off} more off screen: PgDn/PgUp", Style(bold=True), 0))
        fields.append(("←↑↓→ select · ⏎ open · p list view", DIM, 4))
        strip = Strip([Segment(t, on(style, s)) for t, s in fit(fields, max(1, width - 1))]).crop_extend(
            0, width, style
        )
        strip = Strip([Segment(" ", style), *strip]).crop_extend(0, width, style)
        self._header = (key, strip)
        return strip

    def _hint_line(self, y: int, width: int) -> Strip:
        base = self.rich_style
        inner = max(10, min(width - 4, 72))
        w = Wrapped(inner)
        w.reset(HINTS.get(self.mode, HINTS["live"]))
        top = 1
        if top <= y < top + len(w.lines):
            start, end = w.lines[y - top]
            return Strip([Segment("  "), Segment(w.source[start:end], on(base, DIM))]).crop_extend(0, width, base)
        return Strip.blank(width, base)

    def on_resize(self, event: events.Resize) -> None:
        self._clamp_page()
        self.refresh()

    def notify_style_update(self) -> None:
        self._header = None
        for d in self._drawings.values():
            d.forget()
        super().notify_style_update()

    # -- keys ----------------------------------------------------------------------------------------
    def _select(self, rid: int) -> None:
        self.mark(rid)
        self.post_message(RequestSelected(rid))

    def action_move(self, dx: int, dy: int) -> None:
        """Select the pane beside the selected one (the first on the page if none is); past the
        page's edge, the next or previous page."""
        if not self.panes:
            return
        cols, _ = self._tiling()
        per = self.per_page()
        at = next((i for i, p in enumerate(self.panes) if p.rid == self.selected), None)
        if at is None or not (self.page * per <= at < (self.page + 1) * per):
            target = self.page * per
        else:
            target = at + dx + dy * cols
            target = max(0, min(len(self.panes) - 1, target))
        self.page = target // per
        self._select(self.panes[target].rid)
        self.refresh()

    def action_page(self, direction: int) -> None:
        self.action_page_to(self.page + direction)

    def action_first(self) -> None:
        self.action_page_to(0)

    def action_last(self) -> None:
        self.action_page_to(-1)

    def action_page_to(self, page: int) -> None:
        page = self.pages() - 1 if page < 0 else page
        page = max(0, min(page, self.pages() - 1))
        if page != self.page:
            self.page = page
            self.refresh()

    def action_open(self) -> None:
        """Enter: the selected pane's request in the list view (the app switches to it)."""
        if self.selected is not None and any(p.rid == self.selected for p in self.panes):
            self.post_message(PaneOpened(self.selected))
        elif self.visible():
            self.post_message(PaneOpened(self.visible()[0].rid))

    def show_page_of(self, rid: int | None) -> None:
        """Turn to the page that holds ``rid``'s pane, if it has one."""
        at = next((i for i, p in enumerate(self.panes) if p.rid == rid), None)
        if at is not None:
            self.action_page_to(at // self.per_page())

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        i = self._index_at(offset.x, offset.y)
        shown = self.visible()
        if i is not None and i < len(shown) and shown[i].rid is not None:
            self._select(shown[i].rid)
