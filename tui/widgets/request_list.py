"""The requests of one snapshot, newest last; the highlighted row is 'selected'.

``show(frame)`` makes the rows exactly the snapshot's requests, in its order: a request the
snapshot no longer holds (a replay moved back, a server restarted or forgot it) loses its row.

A line-API scroll view rather than a ``DataTable``: the table changes several times a second
while the engine runs, and a DataTable re-renders every visible cell through Rich on each
update (it was the app's costliest widget). Here each row is a cached ``Strip`` rebuilt only
when that request's cells, the width, or the cursor changed, straight from segments.
"""

from __future__ import annotations

from functools import lru_cache

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tinyllm.observe.snapshot import RequestView
from tinyllm.slo import SLOVerdict, track_waits, view_verdict
from tui.runners.interface import Frame
from tui.widgets.deferred import deferred
from tui.widgets.selection import SELECT_BINDINGS, RequestSelected
from tui.widgets.style import CACHED, PLAIN, STATE_STYLES, duration, on, rid_style

# (label, width); the last column takes what is left
COLUMNS = (
    ("#", 4),
    ("state", 9),
    ("slot", 4),
    ("sampling", 13),
    ("tokens", 7),
    ("cached", 6),
    ("TTFT", 6),
    ("tok/s", 5),
    ("text", 0),
)
TEXT_MIN = 16
SAMPLING_W = dict(COLUMNS)["sampling"]
DROP_ORDER = (3, 6, 5, 7)  # narrow: drop sampling, TTFT, cached, then tok/s (the pane shows them)

Cells = tuple[tuple[str, Style], ...]
SLO_STYLES = {"met": Style(color="green", bold=True), "missed": Style(color="red", bold=True)}  # ✓ / ✗ state


def tail(text: str, n: int) -> str:
    """The last ``n`` cells of ``text`` on one line (newlines shown as ⏎), '…' when cut."""
    if n <= 1:
        return "…"[:n]
    flat = text[-(n + 16) :].replace("\n", "⏎ ").replace("\t", " ")  # only the end can show
    if len(text) <= n + 16 and cell_len(flat) <= n:
        return flat
    flat = flat[-(n - 1) :]
    while cell_len(flat) > n - 1:  # wide characters
        flat = flat[1:]
    return "…" + flat


def whole_words(text: str, width: int) -> str:
    """The words of ``text`` that fit ``width`` cells, and "…" where some were left out (a cell
    cut mid-value, ``p=`` without its number, said something false)."""
    if cell_len(text) <= width:
        return text
    kept = ""
    for word in text.split():
        if cell_len(f"{kept} {word}".strip()) > width - 1:
            break
        kept = f"{kept} {word}".strip()
    return kept + "…"


def fit(text: str, width: int) -> str:
    """Pad or cut to exactly ``width`` cells."""
    n = cell_len(text)
    if n <= width:
        return text + " " * (width - n)
    while cell_len(text) > width:
        text = text[:-1]
    return text + " " * (width - cell_len(text))


class RequestList(ScrollView, can_focus=True):
    """Rows keyed by request id; up/down/page/home/end or a click move the cursor, and each move
    posts ``RequestSelected`` with the request id."""

    COMPONENT_CLASSES = {"request-list--header", "request-list--cursor", "request-list--even-row"}
    DEFAULT_CSS = """
    RequestList {
        overflow-x: hidden;
        background: $surface;
        color: $foreground;
        /* a bar of its own colours, one column: its thumb read as stray text at a row's end */
        scrollbar-size-vertical: 1;
        scrollbar-background: $panel;
        scrollbar-color: $primary 70%;
        & > .request-list--header { text-style: bold; background: $panel; color: $foreground; }
        & > .request-list--even-row { background: $surface-lighten-1 50%; }
        & > .request-list--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
        }
        &:focus > .request-list--cursor {
            background: $block-cursor-background;
            color: $block-cursor-foreground;
            text-style: $block-cursor-text-style;
        }
        &:dark > .request-list--even-row { background: $surface-darken-1 40%; }
    }
    """
    BINDINGS = SELECT_BINDINGS + [
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
    ]

    def __init__(self, **kw):
        super().__init__(**kw)
        self.cursor: int | None = None  # row of the selected request, None: no row
        self._rids: list[int] = []  # newest last
        self._row_of: dict[int, int] = {}
        self._shown: dict[int, tuple[RequestView, str]] = {}
        self._cells: dict[int, Cells] = {}
        self._strips: dict[int, tuple[tuple, Strip]] = {}  # rid → (cache key, strip)

    # -- data ---------------------------------------------------------------------------------
    @property
    def row_count(self) -> int:
        return len(self._rids)

    @property
    def rids(self) -> tuple[int, ...]:
        """The request ids shown, top to bottom."""
        return tuple(self._rids)

    def selected_rid(self) -> int | None:
        return self._rids[self.cursor] if self.cursor is not None and self.cursor < len(self._rids) else None

    def select_rid(self, rid: int | None) -> None:
        """Put the cursor on ``rid``'s row (scrolled into view), or hide it when ``rid`` has
        none. Posts nothing: the app decided the selection."""
        row = self._row_of.get(rid) if rid is not None else None
        if row is None:
            if self.cursor is not None:
                self.cursor = None
                self.refresh()
            return
        self._move_cursor(row, announce=False)

    def row_text(self, rid: int) -> str:
        """The row as plain text at the current width, or 160 cells while hidden (tests, copy-out)."""
        return "".join(s.text for s in self._row_strip(self._row_of[rid], self._width() or 160))

    def show(self, frame: Frame) -> None:
        """Make the rows the snapshot's requests, no more, no fewer; rebuild the cells of those
        that changed (running ones always: their rate moves). The cursor stays on its request
        while that request has a row, else it is hidden (``cursor`` None)."""
        now = frame.snapshot.time_s
        views = frame.snapshot.requests
        changed = False
        rids = [v.rid for v in views]
        if rids != self._rids:
            held = self.selected_rid()
            keep = set(rids)
            for gone in [r for r in self._shown if r not in keep]:
                self._shown.pop(gone)
                self._cells.pop(gone, None)
                self._strips.pop(gone, None)
            self._rids = rids
            self._row_of = {rid: i for i, rid in enumerate(rids)}
            self.cursor = self._row_of.get(held) if held is not None else None
            self._strips.clear()  # rows moved: stripes and cursor
            changed = True
        slo, own = self.app.slo, frame.slos  # a workload line's own SLO wins over --slo
        tracks = {t.rid: t for t in frame.tracks} if slo is not None or own else {}
        steps = frame.snapshot.counters.steps
        for v in views:
            text = frame.texts.get(v.rid, "")
            old = self._shown.get(v.rid)
            if old is not None and old[0] is v and old[1] == text and v.state != "running":
                continue
            verdict = view_verdict(v, own.get(v.rid) or slo, track_waits(tracks.get(v.rid), steps))
            cells = self._cells_of(v, text, now, verdict)
            self._shown[v.rid] = (v, text)
            if cells != self._cells.get(v.rid):
                self._cells[v.rid] = cells
                changed = True
        if self.virtual_size.height != len(self._rids) + 1:
            self.virtual_size = Size(0, len(self._rids) + 1)  # rows only: no sideways scroll
        if changed:
            self.refresh()

    @staticmethod
    def _cells_of(v: RequestView, text: str, now: float, verdict: SLOVerdict | None = None) -> Cells:
        """``verdict`` (with --slo, once the request ended): its state marked ✓ met, ✗ missed."""
        tps = v.tokens_per_s(now)
        ttft = v.ttft_s
        state = (v.state, STATE_STYLES[v.state])
        if verdict is not None and verdict.outcome in ("met", "missed"):
            state = (("✓" if verdict.met else "✗") + v.state, SLO_STYLES[verdict.outcome])
        return (
            (str(v.rid), rid_style(v.rid)),
            state,
            ("—" if v.slot is None else str(v.slot), PLAIN),
            (whole_words(v.sampling.describe(), SAMPLING_W), PLAIN),
            (f"{len(v.tokens)}/{v.max_new_tokens}", PLAIN),
            (str(v.cached_tokens) if v.cached_tokens else "—", CACHED if v.cached_tokens else PLAIN),
            (duration(ttft), PLAIN),
            ("—" if tps is None else f"{tps:.1f}", PLAIN),
            (text[-512:], PLAIN),
        )

    # -- rendering (line API) -------------------------------------------------------------------
    def _width(self) -> int:
        return self.scrollable_content_region.width

    def render_line(self, y: int) -> Strip:
        width = self._width()
        if y == 0:
            return self._header(width)
        row = int(self.scroll_offset.y) + y - 1
        if 0 <= row < len(self._rids):
            return self._row_strip(row, width)
        return Strip.blank(width, self.rich_style)

    @staticmethod
    @lru_cache(maxsize=16)
    def _layout(width: int) -> tuple[tuple[int, int], ...]:
        """(column index, width) of the columns that fit; the text column gets the rest."""
        shown = list(range(len(COLUMNS) - 1))
        for drop in DROP_ORDER:
            if width - sum(COLUMNS[i][1] + 1 for i in shown) >= TEXT_MIN:
                break
            shown.remove(drop)
        text_w = max(TEXT_MIN, width - sum(COLUMNS[i][1] + 1 for i in shown))
        return (*((i, COLUMNS[i][1]) for i in shown), (len(COLUMNS) - 1, text_w))

    def _header(self, width: int) -> Strip:
        style = on(self.rich_style, self.get_component_rich_style("request-list--header"))
        segs = [Segment(fit(COLUMNS[i][0], w) + " ", style) for i, w in self._layout(width)]
        return Strip(segs).crop_extend(0, width, style)

    def _row_strip(self, row: int, width: int) -> Strip:
        rid = self._rids[row]
        cells = self._cells[rid]
        kind = "cursor" if row == self.cursor else ("even-row" if row % 2 == 0 else "")
        key = (cells, width, kind, self.has_focus)
        hit = self._strips.get(rid)
        if hit is not None and hit[0] == key:
            return hit[1]
        base = self.rich_style
        if kind:
            base = on(base, self.get_component_rich_style(f"request-list--{kind}"))
        segs = []
        last = len(COLUMNS) - 1
        for i, w in self._layout(width):
            value, style = cells[i]
            segs.append(Segment(fit(tail(value, w) if i == last else value, w), on(base, style)))
            segs.append(Segment(" ", base))
        strip = Strip(segs).crop_extend(0, width, base)
        self._strips[rid] = (key, strip)
        return strip

    def notify_style_update(self) -> None:
        self._strips.clear()  # theme or focus styling changed
        super().notify_style_update()

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    # -- cursor -----------------------------------------------------------------------------------
    def _move_cursor(self, row: int, announce: bool = True, retry: bool = True) -> None:
        if not self._rids:
            return
        row = max(0, min(len(self._rids) - 1, row))
        visible = max(1, self.scrollable_content_region.height - 1)
        top = int(self.scroll_offset.y)
        if row < top:
            self.scroll_to(y=row, animate=False)
        elif row >= top + visible:
            want = row - visible + 1
            self.scroll_to(y=want, animate=False, immediate=True)
            if retry and int(self.scroll_target_y) != want:  # rows just added: the list scrolls only once
                self.call_after_refresh(self._cursor_into_view)  # the next layout has given it its bar
        if row != self.cursor:
            self.cursor = row
            self.refresh()
        if announce:
            self.post_message(RequestSelected(self._rids[row]))

    def on_resize(self, event: events.Resize) -> None:
        """The selected row stays in view when the list gets shorter (a smaller terminal)."""
        self.call_after_refresh(self._cursor_into_view)

    @deferred  # queued after a resize: the list may have gone by then
    def _cursor_into_view(self) -> None:
        if self.cursor is not None:  # (read now: a frame may have moved it since)
            self._move_cursor(self.cursor, announce=False, retry=False)

    def action_move(self, delta: int) -> None:
        if self.cursor is None:  # no row selected: start from an end
            self._move_cursor(0 if delta > 0 else len(self._rids) - 1)
        else:
            self._move_cursor(self.cursor + delta)

    def action_page(self, direction: int) -> None:
        start = self.cursor if self.cursor is not None else 0
        self._move_cursor(start + direction * max(1, self.scrollable_content_region.height - 2))

    def action_move_to(self, row: int) -> None:
        self._move_cursor(row if row >= 0 else len(self._rids) - 1)

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or offset.y == 0:
            return
        self._move_cursor(int(self.scroll_offset.y) + offset.y - 1)
