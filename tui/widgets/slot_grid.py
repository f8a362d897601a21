"""The slot grid: one cell per KV slot, showing who holds it, its state and how full it is."""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget

from tinyllm.observe.snapshot import EngineSnapshot
from tui.widgets.style import DIM, PLAIN, STATE_STYLES, bar, on, rid_style

CELL_W = 18


def slots_title(snap: EngineSnapshot) -> str:
    """The panel's title: the slot cache reserves max_len tokens per slot (``8 × 512 tokens``);
    the paged pool's slots hold only the blocks they use, up to max_len each (its KV panel says
    how many tokens the pool holds)."""
    if snap.kv.kind == "paged":
        return f"Slots ({snap.n_slots}, up to {snap.max_len} tokens each)"
    return f"Slots ({snap.n_slots} × {snap.max_len} tokens)"


class SlotGrid(Widget):
    """Cells like ``03 #12 ██████░░ 140`` (slot, request, context fill, context tokens). A free
    slot is dim; a slot that changed in the latest step is flagged (+ admitted, ✓ finished,
    ⇣ preempt, ✗ aborted). Each cell is exactly CELL_W wide, so the grid stays aligned. When the
    panel has fewer rows than the slots need, its last row says what the slots it cannot draw
    hold (``+24 more slots: 20 held, 4 free``) instead of cutting them off unsaid."""

    DEFAULT_CSS = "SlotGrid { height: auto; min-height: 1; }"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.snapshot: EngineSnapshot | None = None
        self.flags: dict[int, tuple[str, int]] = {}  # slot → (event kind, rid)

    def show(self, snapshot: EngineSnapshot, flags: dict[int, tuple[str, int]]) -> None:
        resized = self.snapshot is None or snapshot.n_slots != self.snapshot.n_slots
        changed = resized or snapshot.slots != self.snapshot.slots or flags != self.flags
        self.snapshot, self.flags = snapshot, flags
        if changed:
            self.refresh(layout=resized)  # a new row count needs a new height

    def _per_row(self, width: int) -> int:
        return max(1, width // CELL_W)

    def get_content_height(self, container, viewport, width: int) -> int:
        n = self.snapshot.n_slots if self.snapshot else 1
        return -(-n // self._per_row(width))

    def shown(self) -> int:
        """How many slots are drawn as cells: all of them, or those before the last row the panel
        has, which then summarises the rest."""
        n = len(self.snapshot.slots) if self.snapshot else 0
        per_row, rows = self._per_row(self.size.width), self.size.height
        return n if rows <= 0 or -(-n // per_row) <= rows else (rows - 1) * per_row

    def more(self) -> str:
        """The summary of the slots not drawn, as much of it as the width takes ("" when every
        slot is drawn). (The panel's height is fixed by the layout: a wider one shows more.)"""
        hidden = self.snapshot.slots[self.shown() :] if self.snapshot else ()
        if not hidden:
            return ""
        held = sum(sv.rid is not None for sv in hidden)
        head = f"+{len(hidden)} more slot{'s' if len(hidden) != 1 else ''}: {held} held"
        full = f"{head}, {len(hidden) - held} free"
        return full if len(full) <= self.size.width else head

    def render_line(self, y: int) -> Strip:
        """Line API: one row of cells, straight to segments (no Rich layout pass: this widget
        changes every frame while the engine runs)."""
        snap = self.snapshot
        width = self.size.width
        base = self.rich_style
        if snap is None:
            return Strip([Segment("starting…", base)]).crop_extend(0, width, base)
        per_row, shown = self._per_row(width), self.shown()
        if y * per_row >= shown and shown < len(snap.slots):
            return Strip([Segment(self.more(), on(base, DIM))] if y * per_row == shown else []).crop_extend(
                0, width, base
            )
        segments = [
            Segment(text, on(base, style))
            for sv in snap.slots[y * per_row : min(shown, (y + 1) * per_row)]
            for text, style in self._cell(sv)
        ]
        return Strip(segments).crop_extend(0, width, base)

    def render(self) -> Text:  # plain text of the grid as drawn (tests, copy-out)
        snap = self.snapshot
        if snap is None:
            return Text("starting…", style="dim")
        per_row, shown = self._per_row(self.size.width), self.shown()
        out = Text(no_wrap=True, overflow="crop")
        for i, sv in enumerate(snap.slots[:shown]):
            if i and i % per_row == 0:
                out.append("\n")
            for text, style in self._cell(sv):
                out.append(text, style)
        if shown < len(snap.slots):
            out.append(("\n" if shown else "") + self.more(), style="dim")
        return out

    def _drafted(self, rid: int) -> bool:
        """Whether ``rid`` verified a speculative draft in the step shown (engine/speculate.py)."""
        snap = self.snapshot
        v = snap.request(rid) if snap is not None and getattr(snap, "speculative", 0) else None
        return v is not None and v.last_draft > 0 and v.last_draft_step == snap.counters.steps

    def _cell(self, sv) -> list[tuple[str, Style]]:
        """One slot's cell as (text, style) pieces, CELL_W cells wide."""
        head = (f"{sv.slot:02d} ", DIM)
        flag = self.flags.get(sv.slot)
        if sv.free and flag is None:
            return [head, ("free".ljust(CELL_W - 3), DIM)]
        if sv.free:  # freed this step: say why
            kind, rid = flag
            mark = {"finish": "✓ done", "preempt": "⇣ preempt", "abort": "✗ aborted"}.get(kind, kind)
            state = {"finish": "finished", "preempt": "preempted", "abort": "aborted"}.get(kind, "finished")
            return [
                head,
                (f"#{rid:<3}", rid_style(rid)),
                (f" {mark}".ljust(CELL_W - 8), STATE_STYLES[state]),
                (" ", PLAIN),
            ]
        running = STATE_STYLES["running"]
        admitted = sv.just_admitted or (flag is not None and flag[0] == "admit")
        mark = "+" if admitted else "▸" if sv.prefill_left else "»" if self._drafted(sv.rid) else " "
        fill = bar(sv.context_len / max(1, sv.capacity), 5, empty="▹" if sv.prefill_left else "░")
        return [
            head,
            (f"#{sv.rid:<3}", rid_style(sv.rid)),
            (mark, running),
            (fill, STATE_STYLES["prefill"] if sv.prefill_left else running),
            (f" {sv.context_len:>3} ", DIM),
        ]
