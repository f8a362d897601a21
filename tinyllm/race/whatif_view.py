"""The what-if comparison as Rich tables: the terminal's (``tinyllm whatif``) and the race
screen's finish line draw the same ones."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from tinyllm.race.verdicts import Judging, rank, what_made_the_difference
from tinyllm.race.views import ARRIVALS_NOTE, LaneView, RequestOutcome, idled
from tinyllm.race.whatif import RequestRow, group_figures, grouping
from tinyllm.slo import SLOVerdict
from tinyllm.units import duration

WAIT_SHORT = {"queue": "queue", "slots": "slots", "pool": "KV", "budget": "budget", "preempted": "recompute"}


def plain_table(title: str, caption: str | None = None, **options) -> Table:
    """A borderless table, its title bold and its caption dim, both left-aligned: every table of
    the comparison (the terminal's and the finish line's) looks the same (``options``: Rich's)."""
    look = dict(box=None, padding=(0, 1), expand=False, title_justify="left", title_style="bold")
    look.update(caption_justify="left", caption_style="dim")
    return Table(title=title, caption=caption, **{**look, **options})


def why(o: RequestOutcome) -> str:
    """``2P KV 14`` : preemptions, then the reason it waited most steps for and how many."""
    parts = [f"{o.preemptions}P"] if o.preemptions else []
    if o.waited:
        code, steps = o.waited[0]
        parts.append(f"{WAIT_SHORT.get(code, code)} {steps}")
    return " ".join(parts) or "—"


def slo_mark(v: SLOVerdict | None) -> Text:
    """A request's verdict in a table cell: ``✓`` green, ``✗ttft`` red (the reason is in "waited")."""
    if v is None:
        return Text("—", style="dim")
    if v.outcome == "met":
        return Text("✓", style="green")
    if v.outcome == "missed":
        return Text("✗" + "+".join(v.missed), style="red")
    return Text(v.outcome, style="dim")


def short_name(v: LaneView, width: int = 14) -> str:
    return v.title if len(v.title) <= width else v.title[: width - 1] + "…"


def letter(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else f"L{i}"


def requests_table(
    lanes: tuple[LaneView, ...],
    rows: tuple[RequestRow, ...],
    limit: int,
    narrow: bool = False,
    selected: int | None = None,
    judging: Judging | None = None,
) -> Table:
    """Per request (most changed first): each lane's TTFT, end-to-end, its SLO verdict (with an
    SLO) and why it waited (lanes lettered A, B, ... as the caption says); the e2e change against
    the first lane (A). A request the recording saw aborted or failed comes last, marked so."""
    judging = judging or Judging()
    verdicts = [judging.verdicts(v) for v in lanes] if judging.active else None
    t = plain_table(
        f"per request, most changed first ({min(limit, len(rows))} of {len(rows)})",
        "  ".join(f"{letter(i)} = {v.title}" for i, v in enumerate(lanes))
        + ("" if narrow else "; waited: the reason it waited most steps for, NP = preempted N times")
        + ("; SLO: ✓ met, ✗ missed (ttft, tpot)" if verdicts else ""),
    )
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("who", no_wrap=True)
    for i in range(len(lanes)):
        t.add_column(f"{letter(i)} TTFT", justify="right", no_wrap=True)
        t.add_column(f"{letter(i)} e2e", justify="right", no_wrap=True)
        if verdicts:
            t.add_column(f"{letter(i)} SLO", no_wrap=True)
        if not narrow:
            t.add_column(f"{letter(i)} waited", no_wrap=True)
    t.add_column("e2e vs A", justify="right", no_wrap=True)
    for row in rows[:limit]:
        who = " ".join(filter(None, [row.tenant, f"p{row.priority}" if row.priority else ""])) or "—"
        mark = "reverse bold" if row.rid == selected else ""
        cells = [Text(str(row.rid), style=mark), Text(who, style="dim")]
        for i, o in enumerate(row.outcomes):
            if o is None:
                cells += [Text("—")] * (2 + bool(verdicts) + (not narrow))
                continue
            cells += [Text(duration(o.ttft_s)), Text(duration(o.e2e_s))]
            if verdicts:
                cells.append(slo_mark(verdicts[i].get(row.rid)))
            if not narrow:
                cells.append(Text(why(o), style="dim"))
        if row.ended:  # its client went away (or the engine gave up): not ranked
            cells.append(Text(row.ended, style="dim italic"))
        else:
            style = "green" if row.change < -0.05 else "red" if row.change > 0.05 else "dim"
            cells.append(Text(f"{row.change:+.0%}", style=style))
        t.add_row(*cells)
    return t


def groups_table(lanes: tuple[LaneView, ...], rows: tuple[RequestRow, ...]) -> Table | None:
    """Per tenant (or priority), per lane: TTFT p50/p95 and end-to-end p95. None with one group."""
    by = grouping(rows)
    if by is None:
        return None
    t = plain_table(f"per {by}")
    for c in (by, "lane", "requests", "TTFT p50", "TTFT p95", "e2e p95", "preempted"):
        t.add_column(c, justify="left" if c in (by, "lane") else "right", no_wrap=True)
    figures = [group_figures(rows, i, by) for i in range(len(lanes))]
    for name in sorted({g for f in figures for g in f}):
        for v, f in zip(lanes, figures):
            g = f.get(name)
            if g is not None:
                t.add_row(
                    name,
                    short_name(v, 24),
                    str(g["requests"]),
                    duration(g["ttft_p50_s"]),
                    duration(g["ttft_p95_s"]),
                    duration(g["e2e_p95_s"]),
                    str(g["preemptions"]),
                )
    return t


def lanes_table(lanes: tuple[LaneView, ...], judging: Judging | None = None) -> Table:
    """One row per lane: tinyllm bench's columns, on each lane's own clock, and where the lanes
    are sized by memory the sequences each can run at once and its KV memory (``64 seqs · 32
    MiB``, as its title in the race says it; it was a second line under each name, which read as
    a lane of its own); with an SLO, its goodput and share met; its place, by the rule the
    caption states."""
    judging = judging or Judging()
    busy = idled(lanes)  # arrivals: every clock ran to about the last one
    ranking = rank(lanes, judging)
    summaries = [judging.summary(v) for v in lanes]
    why = what_made_the_difference(lanes, ranking)
    caption = ranking.rule + (f"\n{why}" if why else "")
    t = plain_table("lanes (each lane's own clock" + (f"; {ARRIVALS_NOTE}" if busy else "") + ")", caption)
    t.add_column("place", justify="right", no_wrap=True)
    t.add_column("lane", no_wrap=False, min_width=12)  # the column that gives way on a narrow terminal
    sized = any(v.kv_mib is not None for v in lanes)
    if sized:
        t.add_column("seqs · KV", justify="right", no_wrap=True)
    slo = judging.active
    for c in (
        *(["goodput", "met"] if slo else []),
        "tok/s",
        "TTFT p50",
        "TTFT p95",
        "latency p95",
        *(["busy"] if busy else []),
        "steps",
        "preempted",
    ):
        t.add_column(c, justify="right", no_wrap=True)
    for i, v in enumerate(lanes):
        r = v.result
        kv = [] if not sized else ["—" if v.kv_mib is None else v.capacity]
        s = summaries[i]
        good = [] if not slo else [goodput_cell(s), met_cell(s)]
        t.add_row(
            str(ranking.places[i]),
            Text(short_name(v, 30)),
            *kv,
            *good,
            f"{r.tok_s:.0f}",
            duration(r.ttft_p50_s),
            duration(r.ttft_p95_s),
            duration(r.latency_p95_s),
            *([duration(r.busy_s)] if busy else []),
            f"{r.decode_steps:,}",
            f"{r.preemptions:,}",
        )
    return t


def goodput_cell(s) -> str:
    """A lane's goodput: ``3.20/s`` (requests/s that met the SLO)."""
    return "—" if s is None else f"{s.goodput:.2f}/s"


def met_cell(s) -> str:
    """``8/10 80%``: the requests that met the SLO of those judged (aborted/failed apart)."""
    if s is None or s.share_met is None:
        return "—"
    return f"{s.met}/{s.judged} {s.share_met:.0%}"


PHASE_GLYPHS = {
    "queued": ("░", "yellow"),
    "prefill": ("▓", "cyan"),
    "decode": ("━", "green"),
    "preempted": ("┄", "red"),
}


def request_lanes(lanes: tuple[LaneView, ...], row: RequestRow, width: int) -> Text:
    """One request's life in every lane, one row per lane over a shared time axis (each lane's
    own clock, from the request's arrival): where it waited, prefilled, decoded, was preempted."""
    label_w = min(24, max(len(v.title) for v in lanes) + 4)
    cols = max(10, width - label_w - 1)
    spans = [o.spans if o is not None else () for o in row.outcomes]
    start = row.arrival_s
    end = max((b for s in spans for _, _, b in s), default=start + 1e-9)
    scale = cols / max(1e-9, end - start)
    t = Text(no_wrap=True, overflow="crop")
    title = f"#{row.rid} across the lanes, arrival → {duration(end - start)} (each lane's clock):"
    legend = "  ".join(f"{glyph} {phase}" for phase, (glyph, _) in PHASE_GLYPHS.items())
    t.append(title, style="bold")
    t.append("  " if len(title) + 2 + len(legend) <= width else "\n")  # (the legend whole, on its own line if need be)
    for phase, (glyph, colour) in PHASE_GLYPHS.items():
        t.append(glyph, style=colour)
        t.append(f" {phase}  ", style="dim")
    for i, (v, s) in enumerate(zip(lanes, spans)):
        t.append("\n")
        t.append(f"{letter(i)} {v.title}"[: label_w - 1].ljust(label_w), style="bold")
        cells = [" "] * cols
        styles = [""] * cols
        for phase, a, b in s:
            glyph, colour = PHASE_GLYPHS.get(phase, ("?", ""))
            lo, hi = int((a - start) * scale), max(int((a - start) * scale) + 1, int((b - start) * scale))
            for c in range(max(0, lo), min(cols, hi)):
                cells[c], styles[c] = glyph, colour
        for c in range(cols):
            t.append(cells[c], style=styles[c])
    return t
