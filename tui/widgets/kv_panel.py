"""KV memory bars (tokens and MiB) and the scheduler's counters."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from tinyllm.observe.stats import percentile
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
        line1 = Text()
        for label, short, n, state in (
            ("queued", "queue", f.snapshot.num_requests_waiting, "queued"),
            ("running", "run", f.snapshot.num_requests_running, "running"),
            ("finished", "done", c.finished, "finished"),
            ("aborted", "abort", c.aborted, "aborted"),
            ("preempted", "preempt", c.preemptions, "preempted"),
            *((("failed", "fail", c.failed, "failed"),) if c.failed else ()),
        ):
            line1.append(f"{label if wide else short} ", style="dim")
            line1.append(f"{n}", style=STATE_STYLES[state])
            line1.append(sep)
        tps = f.tokens_per_s if f.snapshot.busy else 0.0  # nothing running or waiting: nothing generated now
        line2 = Text()
        hits = (("prefix hit", f"{c.prefix_hits / c.prefix_queries:.0%}"),) if c.prefix_queries else ()
        for label, val in (
            ("steps", f"{c.decode_steps:,}"),
            ("tok/s", f"{tps:.0f}"),
            ("rows used", f"{util:.0%}"),
            *hits,
            ("step", f"{f.step_ms:.1f}ms"),
        ):
            line2.append(f"{label} ", style="dim")
            line2.append(val + sep, style="bold")
        line3 = Text()
        line3.append("TTFT p50/p95 ", style="dim")
        line3.append(
            f"{duration(percentile(ttft, 0.5) if ttft else None)}/{duration(percentile(ttft, 0.95) if ttft else None)}  ",
            style="bold",
        )
        line3.append("latency p50/p95 ", style="dim")
        line3.append(
            f"{duration(percentile(lat, 0.5) if lat else None)}/{duration(percentile(lat, 0.95) if lat else None)}",
            style="bold",
        )
        mib = Text(
            f"{kv.mib(kv.used_tokens):.1f} / {kv.mib(kv.allocated_tokens):.1f} / "
            f"{kv.mib(kv.reserved_tokens):.1f} MiB used / claimed / reserved"
            + (f" · {dtype_short(kv.dtype)}" if kv.dtype else ""),
            style="dim",
        )
        if self.app.has_class("-short"):  # 80x24: one bar of the three, figures by priority
            pct = lambda xs, q: duration(percentile(xs, q)) if xs else "—"
            figures = [
                (f"tok/s {tps:.0f} ", "bold", 0),
                (f"TTFT {pct(ttft, 0.5)}/{pct(ttft, 0.95)} ", "bold", 0),
                (f"lat {pct(lat, 0.5)}/{pct(lat, 0.95)} ", "bold", 1),
                (f"rows {util:.0%} ", "dim", 2),
                *([(f"hit {c.prefix_hits / c.prefix_queries:.0%} ", "dim", 3)] if c.prefix_queries else []),
                (f"steps {c.decode_steps:,} ", "dim", 4),
                (f"step {f.step_ms:.1f}ms", "dim", 5),
            ]
            return Text("\n", no_wrap=True, overflow="ellipsis").join(
                [self._one_bar(width), line1, fit_fields(figures, width)]
            )
        return Text("\n", no_wrap=True, overflow="ellipsis").join([mib, *bars, line1, line2, line3])

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
