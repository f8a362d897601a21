"""A Gantt chart over engine steps: one row per request, one column per step (or per group of
steps when zoomed out), one glyph and colour per state.

Rows: the newest requests that fit, oldest on top; moving the selection past the top row scrolls
the rows back, through the newest ``ROWS_KEPT`` requests (the selected one is always among them).
Columns: the rightmost is the step shown now, so the chart scrolls with the run (and with a
replay's position); ← scrolls back in steps, to the first, and the window then stays on those
steps while the run goes on (→ back to the newest: it follows again). Each row is painted span
by span, not cell by cell, so a zoomed-out chart costs the same as a zoomed-in one. A column
covering several steps shows the most telling thing that happened in them (an end beats a
preemption beats a prefill chunk beats decoding).
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.strip import Strip
from textual.widget import Widget

from tinyllm.observe.timeline import Track
from tui.widgets.selection import SELECT_BINDINGS, RequestSelected
from tui.widgets.style import DIM, STATE_COLOURS, on

ZOOMS = (1, 2, 4, 8, 16, 32, 64, 128)
ROWS_KEPT = 10_000  # the requests whose rows the timeline scrolls back through: the newest
# (each row is drawn from its request's spans, so any step of its life can be shown)

# glyph, style, priority (a zoomed column keeps the highest)
QUEUED = ("░", Style(color=STATE_COLOURS["queued"]), 1)
WAIT_RECOMPUTE = ("┄", Style(color=STATE_COLOURS["preempted"]), 2)
PREFILL_WAIT = ("░", Style(color=STATE_COLOURS["prefill"]), 3)
DECODE = ("━", Style(color=STATE_COLOURS["running"]), 4)
DRAFTED = ("»", Style(color=STATE_COLOURS["running"], bold=True), 4.5)  # a decode that verified a draft
PREFILL = ("▓", Style(color=STATE_COLOURS["prefill"], bold=True), 5)
CACHED_ADMIT = ("◆", Style(color=STATE_COLOURS["prefill"], bold=True), 6)
PREEMPT = ("P", Style(color=STATE_COLOURS["preempted"], bold=True, reverse=True), 7)
ENDS = {
    "finished": ("✓", Style(color=STATE_COLOURS["finished"], bold=True), 8),
    "aborted": ("✗", Style(color=STATE_COLOURS["aborted"], bold=True), 8),
    "failed": ("!", Style(color=STATE_COLOURS["failed"], bold=True, reverse=True), 8),
}
PHASE_CELLS = {"queued": QUEUED, "prefill": PREFILL_WAIT, "decode": DECODE, "preempted": WAIT_RECOMPUTE}
# Why it waits (the scheduler's reason, WAIT_REASONS): over the queued / waiting cells, under the rest.
WAIT_CELLS = {
    "queue": QUEUED,
    "slots": ("s", Style(color=STATE_COLOURS["queued"], bold=True), 3.5),
    "pool": ("k", Style(color=STATE_COLOURS["preempted"], bold=True), 3.5),
    "budget": ("b", Style(color=STATE_COLOURS["prefill"], bold=True), 3.5),
    "preempted": WAIT_RECOMPUTE,
}
LEGEND = (
    (QUEUED, "queued"),
    (WAIT_CELLS["slots"], ":no slot"),
    (WAIT_CELLS["pool"], ":KV full"),
    (WAIT_CELLS["budget"], ":budget"),
    (PREFILL, "prefill"),
    (PREFILL_WAIT, "between chunks"),
    (CACHED_ADMIT, "cache hit"),
    (DECODE, "decode"),
    (DRAFTED, "drafted"),
    (PREEMPT, ":preempted"),
    (WAIT_RECOMPUTE, "to recompute"),
    (ENDS["finished"], "done"),
    (ENDS["aborted"], "aborted"),
    (ENDS["failed"], ":failed"),
)


def paint(track: Track, first: int, last: int, per_col: int, now_step: int) -> list[tuple | None]:
    """The cells of one row: columns cover steps [first, last], ``per_col`` steps each."""
    n = (last - first) // per_col + 1
    cells: list[tuple | None] = [None] * n

    def put(a: int, b: int, cell: tuple) -> None:
        a, b = max(a, first), min(b, last)
        if a > b:
            return
        for c in range((a - first) // per_col, (b - first) // per_col + 1):
            if cells[c] is None or cells[c][2] < cell[2]:
                cells[c] = cell

    for sp in track.spans:
        end = sp.end_step if sp.end_step is not None else (track.end_step if track.end else now_step)
        put(sp.start_step, end, PHASE_CELLS[sp.phase])
    for a, b, code in track.wait_spans(now_step):
        put(a, b, WAIT_CELLS.get(code, QUEUED))
    for s in track.draft_steps:
        put(s, s, DRAFTED)
    for s in track.chunk_steps:
        put(s, s, PREFILL)
    for s, cached in track.admissions:
        if cached:
            put(s, s, CACHED_ADMIT)
    for s in track.preempt_steps:
        put(s, s, PREEMPT)
    if track.end:
        put(track.end_step, track.end_step, ENDS[track.end])
    return cells


class TimelinePanel(Widget, can_focus=True):
    """Shows ``Frame.tracks`` up to the step shown now. ``zoom_out`` / ``zoom_in`` change the
    steps per column. Focused, up/down/home/end move the selection as in the request list (it
    takes the list's place on screen, so it takes its keys too)."""

    DEFAULT_CSS = "TimelinePanel { height: 1fr; }"
    BINDINGS = [
        *SELECT_BINDINGS,
        Binding("left", "scroll_steps(-1)", "Earlier steps", show=False),
        Binding("right", "scroll_steps(1)", "Later steps", show=False),
    ]

    def __init__(self, **kw):
        super().__init__(**kw)
        self.tracks: tuple[Track, ...] = ()
        self.now_step = 0
        self.selected: int | None = None
        self.zoom = 0  # index into ZOOMS
        self.unit = "step"  # what a column counts ("s" attached to vLLM)
        self.pinned: int | None = None  # scrolled back: the last step shown (None: the newest)
        self._top: int | None = None  # the top row shown, an index in the rows kept (None: the newest)

    @property
    def per_col(self) -> int:
        return ZOOMS[self.zoom]

    def show(self, tracks: tuple[Track, ...], now_step: int, selected: int | None) -> None:
        if (tracks, now_step, selected) != (self.tracks, self.now_step, self.selected):
            self.tracks, self.now_step, self.selected = tracks, now_step, selected
            self.refresh()

    def _select_row(self, i: int) -> None:
        if self.tracks:
            self.post_message(RequestSelected(self.tracks[max(0, min(len(self.tracks) - 1, i))].rid))

    def action_move(self, delta: int) -> None:
        rids = [t.rid for t in self.tracks]
        here = rids.index(self.selected) if self.selected in rids else (-1 if delta > 0 else len(rids))
        self._select_row(here + delta)

    def action_move_to(self, i: int) -> None:
        self._select_row(i if i >= 0 else len(self.tracks) - 1)

    def action_scroll_steps(self, direction: int) -> None:
        """A quarter of the chart's width back (-1) or on (1); on to the newest step, it follows
        the run again."""
        cols = max(1, self.size.width - self._window(self.size.width)[0])
        span = cols * self.per_col
        last = self._window(self.size.width)[2]
        last += direction * max(1, cols // 4) * self.per_col
        earliest = min(self.now_step, span - 1)  # the window's first step is 0 at most
        self.pinned = None if last >= self.now_step else max(earliest, last)
        self.refresh()

    def zoom_out(self) -> bool:
        return self._set_zoom(self.zoom + 1)

    def zoom_in(self) -> bool:
        return self._set_zoom(self.zoom - 1)

    def _set_zoom(self, z: int) -> bool:
        if not 0 <= z < len(ZOOMS):
            return False
        self.zoom = z
        self.refresh()
        return True

    # -- layout ---------------------------------------------------------------------------------
    def _kept(self) -> tuple[Track, ...]:
        return self.tracks[-ROWS_KEPT:]

    def _top_for(self, n: int) -> int:
        """The top row for ``n`` rows: the newest rows, unless the selection went above them; then
        the rows scroll only as far as it needs (as a list's do)."""
        kept = self._kept()
        newest = max(0, len(kept) - n)
        i = next((k for k, t in enumerate(kept) if t.rid == self.selected), None)
        if i is None or i == len(kept) - 1:  # none selected, or the newest: follow the run
            return newest
        top = newest if self._top is None else min(self._top, newest)
        if i < top:
            top = i
        elif i >= top + n:
            top = i - n + 1
        return max(0, min(top, newest))

    def _tracks_in(self, n: int) -> list[Track]:
        """``n`` rows from the top row (the selected one among them, when it is among the rows
        kept); oldest on top."""
        if n <= 0 or not self.tracks:
            return []
        kept = self._kept()
        top = self._top_for(n)
        rows = list(kept[top : top + n])
        if self.selected is not None and all(t.rid != self.selected for t in rows):
            sel = next((t for t in self.tracks if t.rid == self.selected), None)
            if sel is not None:
                rows = [sel] + rows[1:] if len(rows) == n else [sel] + rows
        return rows

    def _window(self, width: int) -> tuple[int, int, int]:
        """(label width, first step, last step) for a chart this wide."""
        label = len(str(self.tracks[-1].rid if self.tracks else 0)) + 2
        cols = max(1, width - label)
        last = max(self.now_step, 0) if self.pinned is None else min(self.pinned, max(self.now_step, 0))
        first = last - cols * self.per_col + 1
        return label, first, last

    def _header(self, width: int, height: int) -> list[list[Segment]]:
        """The header over the rows it leaves room for: worked out over the most rows there can be,
        then again over those it leaves (a glyph only an oldest row had is not named)."""
        header = self._header_over(width, height, self._tracks_in(max(0, height - 1)))
        if len(header) > 1:
            header = self._header_over(width, height, self._tracks_in(max(0, height - len(header))))
        return header

    def _header_over(self, width: int, height: int, rows: list[Track]) -> list[list[Segment]]:
        """The window's steps, then the key to the cells on screen now (the whole key is ~110
        columns: it was cut off at 120; F1 lists every glyph), on as many lines as the width needs,
        at most a quarter of the panel's (and three); "…" ends one with no room for the rest."""
        label, first, last = self._window(width)
        base = self.rich_style
        u = self.unit
        head = (
            f"{u}s {max(first, 0)}–{last} · {self.per_col} {u}{'s' if self.per_col > 1 else ''}/col"
            if u == "step"
            else f"{max(first, 0)}–{last} {u} · {self.per_col} {u}/col"
        )
        if last < self.now_step:  # scrolled back: say how to get back
            head += f" · now {self.now_step}: →"
        shown = {c for t in rows for c in paint(t, first, last, self.per_col, self.now_step) if c is not None}
        items = [
            [Segment(glyph, on(base, style)), Segment(name, on(base, DIM))]
            for (glyph, style, _), name in LEGEND
            if (glyph, style, _) in shown
        ]
        lines: list[list[Segment]] = [[Segment(head, on(base, DIM))]]
        most = max(1, min(3, height // 4))
        for i, item in enumerate(items):
            size = sum(len(seg.text) for seg in item)
            while True:
                gap = (2 if len(lines) == 1 else 1) if lines[-1] else 0
                room = width - (2 if len(lines) == most and i < len(items) - 1 else 0)  # (for " …")
                if sum(len(seg.text) for seg in lines[-1]) + gap + size <= room:
                    lines[-1] += [Segment(" " * gap, on(base, DIM))] + item
                    break
                if len(lines) == most:  # no room for the rest: say so (F1 has them all)
                    lines[-1].append(Segment(" …", on(base, DIM)))
                    return lines
                lines.append([])
        return lines

    def _layout(self, width: int, height: int) -> tuple[list[list[Segment]], list[Track]]:
        """(header lines, rows) as drawn now: worked out once per change, not once per line."""
        key = (self.tracks, self.now_step, self.selected, self.zoom, self.pinned, width, height, self.rich_style)
        if getattr(self, "_laid_out", (None,))[0] != key:
            header = self._header(width, height)
            n = max(0, height - len(header))
            self._laid_out = (key, (header, self._tracks_in(n)))
            top = self._top_for(n)  # where the rows scroll from next time (the newest: they follow)
            self._top = None if top >= len(self._kept()) - n else top
        return self._laid_out[1]

    def render_line(self, y: int) -> Strip:
        width, height, base = self.size.width, self.size.height, self.rich_style
        if not self.tracks:
            if y == 0:
                return Strip([Segment("no requests yet: each will get a row here", on(base, DIM))]).crop_extend(
                    0, width, base
                )
            return Strip.blank(width, base)
        header, rows = self._layout(width, height)
        if y < len(header):
            return Strip(header[y]).crop_extend(0, width, base)
        if y - len(header) >= len(rows):
            return Strip.blank(width, base)
        t = rows[y - len(header)]
        label, first, last = self._window(width)
        sel = t.rid == self.selected
        segs = [Segment(f"#{t.rid}".rjust(label - 1) + " ", on(base, Style(bold=True, reverse=sel)))]
        run_style, run = None, []
        for cell in paint(t, first, last, self.per_col, self.now_step):
            glyph, style = (" ", DIM) if cell is None else (cell[0], cell[1])
            if style is not run_style and run:
                segs.append(Segment("".join(run), on(base, run_style)))
                run = []
            run_style = style
            run.append(glyph)
        if run:
            segs.append(Segment("".join(run), on(base, run_style)))
        return Strip(segs).crop_extend(0, width, base)

    def render(self) -> Text:  # plain text (tests, copy-out)
        height = self.size.height or 10
        lines = ["".join(s.text for s in self.render_line(y)) for y in range(height)]
        return Text("\n".join(line.rstrip() for line in lines))
