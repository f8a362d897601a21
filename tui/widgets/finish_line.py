"""The race's finish line: one row per lane on each lane's own clock, its place by a rule it
states (finishing time without arrivals; goodput, with an SLO, then latency p95 with them), and
for a what-if the per-request comparison with each request's SLO verdict."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widget import Widget

from tinyllm.race.verdicts import Judging, rank, what_made_the_difference
from tinyllm.race.views import ARRIVALS_NOTE, LaneView, idled, mib
from tinyllm.race.whatif import compare
from tinyllm.race.whatif_view import goodput_cell, groups_table, met_cell, plain_table, request_lanes, requests_table
from tinyllm.request import kv_dtype_tag
from tui.widgets.race_track import NAMES, lane_name
from tui.widgets.style import duration

# The finish line's columns in the order drawn, and the order they are added in while they fit
# the width (the most telling first; the place leads when the ranking is not by finishing time).
# fmt: off
COLUMNS = (
    "lane", "place", "goodput", "met", "tok/s", "× static", "seqs · KV", "TTFT p50", "TTFT p95",
    "latency p95", "busy", "row util", "KV mean", "preempted", "steps",
)
TELLING = (
    "TTFT p50", "latency p95", "busy", "row util", "KV mean", "preempted", "steps", "TTFT p95",
    "seqs · KV", "place",
)
# fmt: on


def unequal_memory(lanes: tuple[LaneView, ...]) -> str:
    """Where the lanes hold different KV memory, a clause saying so (the verdict is then partly
    the memory's): a race from the app with --kv-blocks gave the slot lanes their max_len rows and
    the budget lane its blocks, 24 MiB against 4.5 MiB, and nothing on screen said why it lost."""
    held = [(lane_name(v), v.kv_mib) for v in lanes if v.kv_mib is not None]
    if len(held) < 2 or max(m for _, m in held) <= 1.1 * min(m for _, m in held):
        return ""
    each = ", ".join(f"{name} {mib(m)}" for name, m in held)
    return f"; the lanes hold unequal KV memory ({each}): --kv-memory MiB races them at equal memory"


class FinishLine(Widget):
    """The final table: tinyllm bench's columns, one row per lane, on each lane's own clock."""

    DEFAULT_CSS = "FinishLine { height: auto; }"

    def __init__(self, judging: Judging | None = None, **kw):
        super().__init__(**kw)
        self.lanes: tuple[LaneView, ...] = ()
        self.judging = judging or Judging()  # the SLO each request is judged against (--slo)

    cold_steps = 0  # steps timed after a pause (RaceFrame.cold_steps)
    turns = 0  # the race's steps, all lanes (RaceFrame.turns)
    clock = ""  # what the lanes' times rest on (RaceFrame.clock)

    def show(self, lanes: tuple[LaneView, ...], cold_steps: int = 0, turns: int = 0, clock: str = "") -> None:
        if (lanes, cold_steps, turns, clock) != (self.lanes, self.cold_steps, self.turns, self.clock):
            self.lanes, self.cold_steps, self.turns, self.clock = lanes, cold_steps, turns, clock
            self.refresh(layout=True)

    def get_content_height(self, container, viewport, width: int) -> int:
        if not self.lanes or any(v.result is None for v in self.lanes):
            return len(self.lanes) + 2
        # the lines it renders to at this width: titles and legends wrap (a wrapped legend counted
        # as one line cut the last lane of the request's chart)
        options = self.app.console.options.update_width(max(1, width))
        return len(self.app.console.render_lines(self._content(width), options, pad=False))

    def move(self, delta: int) -> bool:
        """Select the next / previous request of the comparison (its lanes' rows show below it)."""
        if not self.comparing:
            return False
        shown = compare(self.lanes, self.judging)[: self.rows]
        self.selected = max(0, min(len(shown) - 1, self.selected + delta))
        self.refresh()
        return True

    @property
    def comparing(self) -> bool:
        return self.comparing_lanes(self.lanes)

    @staticmethod
    def comparing_lanes(lanes: tuple[LaneView, ...]) -> bool:
        """A what-if (lanes with their own settings, all done): the per-request comparison shows."""
        return bool(lanes) and any(v.key not in NAMES for v in lanes) and all(v.outcomes for v in lanes)

    rows = 12  # requests shown in the comparison, most changed first
    selected = 0  # the comparison's row whose lanes show below it

    def render(self) -> Group | Table:
        return self._content(self.size.width)

    def _content(self, width: int) -> Group | Table:
        lanes = self._lanes_table(width)
        if not self.comparing:
            return lanes
        rows = compare(self.lanes, self.judging)
        groups = groups_table(self.lanes, rows)
        parts = [lanes, Text("")] + ([groups, Text("")] if groups is not None else [])
        row = rows[min(self.selected, len(rows) - 1)]
        narrow = width < 24 + (22 + 6 * self.judging.active) * len(self.lanes)
        table = requests_table(self.lanes, rows, self.rows, narrow=narrow, selected=row.rid, judging=self.judging)
        return Group(*parts, table, Text(""), request_lanes(self.lanes, row, max(40, width - 2)))

    def _lanes_table(self, width: int) -> Table:
        """tinyllm bench's columns, one row per lane: its tokens/s and against static batching (the
        race's point) always; then, as the width allows, most telling first, TTFT p50, latency p95,
        its compute time where requests arrived over time (``busy``: its clock less its waits for
        arrivals; the place is then by latency p95, since every clock ran to the last arrival), row
        use, the mean share of its KV memory in use (a lane's bar says the share now), its
        preemptions (where a lane preempted: a pool too small for its sequences), steps,
        TTFT p95, its sequences and KV memory (``64 · 32 MiB``: at equal memory, why the paged
        lanes win; the lanes' titles say it too), and its place."""
        arrivals = idled(self.lanes)  # every lane's clock runs to about the last arrival
        base = next((v.result.tok_s for v in self.lanes if v.kind == "static"), None)
        ranking = rank(self.lanes, self.judging)
        slo = self.judging.active
        cold = (
            f"; {self.cold_steps:,} of its {max(self.turns, self.cold_steps):,} steps ran after a pause (slow "
            f"motion or stepped by hand), "
            f"whose caches had gone cold: their clocks read high, r at full speed for flat-out figures"
            if self.cold_steps
            else ""
        )
        t = plain_table(
            "finish line (each lane's own clock"
            + (f" on {self.clock}" if self.clock else "")
            + (f"; {ARRIVALS_NOTE}" if arrivals else "")
            + cold
            + f"; {ranking.rule}{unequal_memory(self.lanes)})",
            what_made_the_difference(self.lanes, ranking) or None,
        )
        rows = []
        for i, v in enumerate(self.lanes):
            r = v.result
            s = self.judging.summary(v)
            rows.append(
                {
                    "lane": lane_name(v),
                    "place": f"{ranking.places[i]}",
                    "goodput": goodput_cell(s),
                    "met": met_cell(s),
                    "busy": duration(r.busy_s),
                    "tok/s": f"{r.tok_s:.0f}",
                    "× static": f"{r.tok_s / base:.2f}x" if base else "",
                    "seqs · KV": ""
                    if v.kv_mib is None
                    else " ".join(
                        filter(None, (f"{v.seqs} · {mib(v.kv_mib)}", kv_dtype_tag(v.kv_dtype)))
                    ),  # (as its title: bf16)
                    "TTFT p50": duration(r.ttft_p50_s),
                    "TTFT p95": duration(r.ttft_p95_s),
                    "latency p95": duration(r.latency_p95_s),
                    "row util": f"{r.row_util:.0%}",
                    "KV mean": f"{r.kv_used_mean:.0%}",
                    "steps": f"{r.decode_steps:,}",
                    "preempted": f"{r.preemptions:,}",
                }
            )
        cols = ["lane", "tok/s"] + (["× static"] if base else [])

        def col_width(c: str) -> int:
            return max(len(c), *(len(row[c]) for row in rows)) + 2

        used = sum(map(col_width, cols))
        preempted = any(v.result.preemptions for v in self.lanes)  # shown where a lane preempted
        telling = TELLING
        if ranking.by != "finishing time":  # the place is by goodput / latency then: it says the most
            telling = ("place",) + telling[:-1]
        if slo:
            telling = ("goodput", "met") + telling
        for c in telling:
            shown = {"seqs · KV": any(row[c] for row in rows), "preempted": preempted, "busy": arrivals}.get(c, True)
            if shown and used + col_width(c) <= width:
                cols.append(c)  # what fits, most telling first
                used += col_width(c)
        cols.sort(key=COLUMNS.index)
        for c in cols:
            t.add_column(c, justify="left" if c == "lane" else "right", no_wrap=True)
        for row in rows:
            t.add_row(*(Text(row[c], style="bold" if c == "tok/s" else "") for c in cols))
        return t
