"""The slot grid: one cell per KV slot, showing who holds it, its state and how full it is."""

from __future__ import annotations

from rich.segment import Segment
from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget

from tinyllm.snapshot import EngineSnapshot
from tui.widgets.style import STATE_STYLES, bar, rid_style

CELL_W = 18


class SlotGrid(Widget):
    """Cells like ``03 #12 ██████░░ 140`` (slot, request, context fill, context tokens). A free
    slot is dim; a slot that changed in the latest step is flagged (+ admitted, ✓ finished,
    ⇣ preempted, ✗ aborted)."""

    DEFAULT_CSS = "SlotGrid { height: auto; min-height: 1; }"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.snapshot: EngineSnapshot | None = None
        self.flags: dict[int, tuple[str, int]] = {}          # slot → (event kind, rid)

    def show(self, snapshot: EngineSnapshot, flags: dict[int, tuple[str, int]]) -> None:
        changed = self.snapshot is None or snapshot.slots != self.snapshot.slots or flags != self.flags
        self.snapshot, self.flags = snapshot, flags
        if changed:
            self.refresh()

    def _per_row(self, width: int) -> int:
        return max(1, width // CELL_W)

    def get_content_height(self, container, viewport, width: int) -> int:
        n = self.snapshot.n_slots if self.snapshot else 1
        return -(-n // self._per_row(width))

    def render_line(self, y: int) -> Strip:
        """Line API: one row of cells, straight to segments (no Rich layout pass: this widget
        changes every frame while the engine runs)."""
        snap = self.snapshot
        width = self.size.width
        if snap is None:
            return Strip([Segment("starting…")]).crop_extend(0, width, self.rich_style)
        per_row = self._per_row(width)
        segments: list[Segment] = []
        for sv in snap.slots[y * per_row:(y + 1) * per_row]:
            segments.extend(self._cell(sv, snap).render(self.app.console))
        return Strip(segments).crop_extend(0, width, self.rich_style)

    def render(self) -> Text:                         # plain text of the grid (tests, copy-out)
        snap = self.snapshot
        if snap is None:
            return Text("starting…", style="dim")
        per_row = self._per_row(self.size.width)
        out = Text(no_wrap=True, overflow="crop")
        for i, sv in enumerate(snap.slots):
            if i and i % per_row == 0:
                out.append("\n")
            out.append_text(self._cell(sv, snap))
        return out

    def _cell(self, sv, snap: EngineSnapshot) -> Text:
        cell = Text()
        cell.append(f"{sv.slot:02d} ", style="dim")
        flag = self.flags.get(sv.slot)
        if sv.free and flag is None:
            cell.append("free".ljust(CELL_W - 4), style="dim")
            return cell
        if sv.free:                                      # freed this step: say why
            kind, rid = flag
            mark = {"finish": "✓ done", "preempt": "⇣ preempted", "abort": "✗ aborted"}.get(kind, kind)
            cell.append(f"#{rid:<3}", style=rid_style(rid))
            state = {"finish": "finished", "preempt": "preempted", "abort": "aborted"}.get(kind, "finished")
            cell.append(f" {mark}".ljust(CELL_W - 8), style=STATE_STYLES[state])
            cell.append(" ")
            return cell
        cell.append(f"#{sv.rid:<3}", style=rid_style(sv.rid))
        style = STATE_STYLES["running"]
        if sv.just_admitted or (flag and flag[0] == "admit"):
            cell.append("+", style=style)
        else:
            cell.append(" ")
        cell.append(bar(sv.context_len / max(1, sv.capacity), 5), style=style)
        cell.append(f" {sv.context_len:>3} ", style="dim")
        return cell
