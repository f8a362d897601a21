"""All requests (finished and aborted ones stay), newest last; the highlighted row is 'selected'."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from tinyllm.snapshot import RequestView
from tui.runner import Frame
from tui.widgets.style import STATE_STYLES, rid_style

COLUMNS = (("id", "#", 4), ("state", "state", 9), ("slot", "slot", 4), ("sampling", "sampling", 13),
           ("tok", "tokens", 7), ("ttft", "TTFT", 6), ("tps", "tok/s", 5), ("text", "text", 48))
TAIL = 48


def tail(text: str, n: int = TAIL) -> str:
    flat = text.replace("\n", "⏎ ").replace("\t", " ")
    return flat if len(flat) <= n else "…" + flat[-(n - 1):]


class RequestTable(DataTable):
    """Rows are keyed by request id and only rows whose request changed are rewritten."""

    def __init__(self, **kw):
        super().__init__(cursor_type="row", zebra_stripes=True, **kw)
        self._shown: dict[int, tuple[RequestView, str]] = {}

    def on_mount(self) -> None:
        for key, label, width in COLUMNS:
            self.add_column(label, key=key, width=width)

    def selected_rid(self) -> int | None:
        if not self.row_count:
            return None
        try:
            key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        except Exception:
            return None
        return int(key.value) if key.value is not None else None

    def select_rid(self, rid: int) -> None:
        if str(rid) in self.rows:
            self.move_cursor(row=self.get_row_index(str(rid)))

    def show(self, frame: Frame) -> None:
        now = frame.snapshot.time_s
        for v in frame.snapshot.requests:
            text = frame.texts.get(v.rid, "")
            old = self._shown.get(v.rid)
            if old is not None and old[0] is v and old[1] == text and v.state != "running":
                continue
            cells = self._cells(v, text, now)
            if old is None:
                self.add_row(*cells, key=str(v.rid))
            else:
                for (col, _, _), cell in zip(COLUMNS, cells):
                    self.update_cell(str(v.rid), col, cell)
            self._shown[v.rid] = (v, text)

    @staticmethod
    def _cells(v: RequestView, text: str, now: float) -> list[Text]:
        tps = v.tokens_per_s(now)
        ttft = v.ttft_s
        return [Text(f"{v.rid}", style=rid_style(v.rid)), Text(v.state, style=STATE_STYLES[v.state]),
                Text("—" if v.slot is None else str(v.slot)), Text(v.sampling.describe()),
                Text(f"{len(v.tokens)}/{v.max_new_tokens}", no_wrap=True),
                Text("—" if ttft is None else f"{ttft:.2f}s"), Text("—" if tps is None else f"{tps:.1f}"),
                Text(tail(text), no_wrap=True)]
