"""KV memory bars (tokens and MiB) and the scheduler's counters."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.widget import Widget

from tinyllm.observe.stats import percentile
from tinyllm.slo import snapshot_summary
from tui.runners.interface import Frame
from tui.widgets.status import fit_fields
from tui.widgets.style import STATE_STYLES, bar, dtype_short, dtype_tag, duration


class KVPanel(Widget):
    DEFAULT_CSS = "KVPanel { height: auto; text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.frame: Frame | None = None

    def show(self, frame: Frame) -> None:
        self.frame = frame
        self.refresh()

    def get_content_height(self, container, viewport, width: int) -> int:
        return 3 if self.app.has_class("-short") else 7

    def render(self):
        f = self.frame
        if f is None:
            return Text("")
        kv, c = f.snapshot.kv, f.snapshot.counters
        width = max(10, self.size.width)
        wide = width >= 60
        bar_w = max(3, min(40, width - (50 if wide else 28)))
        sep = "  " if wide else " "
        bars: list[Text] = []
        rows = [
            ("used/reserv", kv.used_tokens, kv.reserved_tokens),
            ("alloc/reserv", kv.allocated_tokens, kv.reserved_tokens),
            ("used/alloc", kv.used_tokens, kv.allocated_tokens),
        ]
        for label, a, b in rows:
            frac = a / b if b else 0.0
            nums = (
                f"{frac:4.0%} {a:>5}/{b:<5} tok {kv.mib(a):4.1f}/{kv.mib(b):.1f} MiB"
                if wide
                else f"{frac:4.0%} {a}/{b}"
            )
            line = Text(label.ljust(13), style="dim")
            line.append(bar(frac, bar_w), style="bold")
            line.append(" " + nums)
            bars.append(line)
        reqs = f.snapshot.requests
        done = [r for r in reqs if r.state == "finished"]
        ttft = sorted(r.ttft_s for r in reqs if r.ttft_s is not None)
        lat = sorted(r.latency_s for r in done)
        util = c.useful_rows / c.computed_rows if c.computed_rows else 0.0
        line1 = self._counters(width, wide, sep)
        tps = f.tokens_per_s if f.snapshot.busy else 0.0  # nothing running or waiting: nothing generated now
        hits = ((f"{c.prefix_hits / c.prefix_queries:.0%}"),) if c.prefix_queries else ()
        rolled = rolled_back(f.snapshot)
        line2 = fit_fields(  # the last step's time and tok/s stay ("prefix hit 12% step …" hid it)
            [
                (_figure("steps", f"{c.decode_steps:,}", sep), "", 3),
                (_figure("tok/s", f"{tps:.0f}", sep), "", 0),
                (_figure("rows used", f"{util:.0%}", sep), "", 2),
                *((_figure("prefix hit", hit, sep), "", 1) for hit in hits),
                *(
                    [
                        (_figure("drafts kept", f"{c.spec_accepted_tokens / c.spec_draft_tokens:.0%}", sep), "", 0),
                        *([(_figure("rolled back", f"{rolled}", sep), "", 0)] if rolled else []),
                        (_figure("by position", by_position(c), sep), "dim", 2),
                    ]
                    if c.spec_draft_tokens
                    else []
                ),
                (_figure("step", step_time(f), sep), "", 0),
            ],
            width,
        )
        p = lambda xs, q: duration(percentile(xs, q) if xs else None)  # noqa: E731
        slo = snapshot_summary(f.snapshot, f.tracks, self.app.slo, f.slos)
        line3 = fit_fields(
            [
                *slo_figures(slo, "  "),
                (_figure("TTFT p50/p95", f"{p(ttft, 0.5)}/{p(ttft, 0.95)}", "  "), "", 0),
                (_figure("latency p50/p95", f"{p(lat, 0.5)}/{p(lat, 0.95)}", ""), "", 1),
            ],
            width,
        )
        used, claimed, reserved = (kv.mib(n) for n in (kv.used_tokens, kv.allocated_tokens, kv.reserved_tokens))
        dtype = f" · {dtype_short(kv.dtype)}" if kv.dtype else ""
        mib = Text(
            next(
                (
                    line
                    for line in (
                        f"{used:.1f} / {claimed:.1f} / {reserved:.1f} MiB used / claimed / reserved{dtype}",
                        f"{used:.1f}/{claimed:.1f}/{reserved:.1f} MiB used/claimed/reserved{dtype}",
                    )
                    if cell_len(line) <= width
                ),
                f"{used:.1f}/{claimed:.1f}/{reserved:.1f} MiB{dtype}",
            ),
            style="dim",
        )
        if self.app.has_class("-short"):  # 80x24: one bar of the three, figures by priority
            pct = lambda xs, q: duration(percentile(xs, q)) if xs else "—"  # noqa: E731
            figures = [
                (f"tok/s {tps:.0f} ", "bold", 0),
                *slo_figures(slo, " "),
                (f"TTFT {pct(ttft, 0.5)}/{pct(ttft, 0.95)} ", "bold", 0),
                (f"lat {pct(lat, 0.5)}/{pct(lat, 0.95)} ", "bold", 1),
                (f"rows {util:.0%} ", "dim", 2),
                *([(f"hit {c.prefix_hits / c.prefix_queries:.0%} ", "dim", 3)] if c.prefix_queries else []),
                *(
                    [(f"drafts {c.spec_accepted_tokens / c.spec_draft_tokens:.0%} ", "dim", 3)]
                    if c.spec_draft_tokens
                    else []
                ),
                (f"steps {c.decode_steps:,} ", "dim", 4),
                (f"step {step_time(f)}", "dim", 5),
            ]
            return Text("\n", no_wrap=True, overflow="ellipsis").join(
                [self._one_bar(width), line1, fit_fields(figures, width)]
            )
        return Text("\n", no_wrap=True, overflow="ellipsis").join([mib, *bars, line1, line2, line3])

    def _counters(self, width: int, wide: bool, sep: str) -> Text:
        """queued / running / finished, then failed, preempted and aborted: those not zero before
        those that are, each whole (at 80x24 ``preempt 1…`` hid the count)."""
        f = self.frame
        c = f.snapshot.counters
        fields = [
            ("queued", "queue", f.snapshot.num_requests_waiting, "queued", 0),
            ("running", "run", f.snapshot.num_requests_running, "running", 0),
            ("finished", "done", c.finished, "finished", 0),
            ("aborted", "abort", c.aborted, "aborted", 3),
            ("preempted", "preempt", c.preemptions, "preempted", 2),
            *((("failed", "fail", c.failed, "failed", 1),) if c.failed else ()),
        ]
        out = []
        for label, short, n, state, rank in fields:
            t = Text(f"{label if wide else short} ", style="dim")
            t.append(f"{n}", style=STATE_STYLES[state])
            t.append(sep)
            out.append((t, "", rank if n or not rank else rank + 3))
        return fit_fields(out, width)

    def _one_bar(self, width: int) -> Text:
        """█ used, ▒ allocated but not yet used, ░ reserved: the three KV figures in one line (the
        panel's title says which is which at this size)."""
        kv = self.frame.snapshot.kv
        tag = dtype_tag(kv)
        nums = f" {kv.used_tokens}/{kv.allocated_tokens}/{kv.reserved_tokens} tok{' ' + tag if tag else ''}"
        w = max(3, width - len(nums) - 3)
        total = max(1, kv.reserved_tokens)
        used = round(w * kv.used_tokens / total)
        alloc = max(used, round(w * kv.allocated_tokens / total))
        line = Text("KV ", style="dim")
        line.append("█" * used, style="bold")
        line.append("▒" * (alloc - used), style="bold")
        line.append("░" * (w - alloc))
        line.append(nums)
        return line


def slo_figures(slo, sep: str) -> list[tuple[Text, str, int]]:
    """With --slo, one field: ``goodput 1.20/s 8/10 met`` (requests/s that met it since the first
    arrival; of the requests ended and judged, those that met it: aborted and failed apart)."""
    if slo is None:
        return []
    t = _figure("goodput", f"{slo.goodput:.2f}/s", " ")
    t.append(f"{slo.met}/{slo.judged}", style="bold green" if slo.missed == 0 else "bold red")
    t.append(" met" + sep, style="dim")
    return [(t, "", 0)]


def _figure(label: str, value: str, sep: str) -> Text:
    """``label value`` as the counter lines write it: the label dim, the value bold."""
    t = Text(f"{label} ", style="dim")
    t.append(value + sep, style="bold")
    return t


def rolled_back(snap) -> int:
    """Tokens of K/V the latest step wrote for drafts and rolled back (their rejected tails): the
    room in the pool a draft held for one step (engine/speculate.py)."""
    step = snap.counters.steps
    return sum(v.last_draft - v.last_kept for v in snap.requests if v.last_draft_step == step)


def by_position(c) -> str:
    """Speculation's acceptance by draft position, vLLM's way (accepted at position i over the
    drafts verified): ``52/40/21/9%``."""
    if not c.spec_drafts:
        return "—"
    return "/".join(f"{n / c.spec_drafts * 100:.0f}" for n in c.spec_accepted_per_pos) + "%"


def step_time(f) -> str:
    """The latest step's compute time, or "—" where the frame does not know it (a server's state
    stream does not carry it: it showed 0.0ms under load)."""
    return "—" if f.step_ms is None else f"{f.step_ms:.1f}ms"
