"""A vLLM server's figures (from its /metrics), where the slot grid and KV panels would be.

It also says what it cannot show and why: a vLLM server exposes gauges and histograms, not
which request holds which slot or block (``tinyllm serve`` streams those)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.widget import Widget

from tui.widgets.style import STATE_COLOURS, bar, duration

if TYPE_CHECKING:  # prometheus_client loads only when attached to a server
    from tui.runners.vllm_metrics import ServerFigures


class ServerPanel(Widget):
    DEFAULT_CSS = "ServerPanel { height: auto; }"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.figures: ServerFigures | None = None
        self.events_shown = False  # --kv-events: the prefix cache is drawn beside this panel

    def show(self, figures: ServerFigures | None) -> None:
        if figures != self.figures:
            self.figures = figures
            self.refresh(layout=True)

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self.render().plain.splitlines()) or 1

    def render(self) -> Text:
        f = self.figures
        if f is None:
            return Text("no metrics yet", style="dim")
        w = max(8, min(30, self.size.width - 16))
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append("requests  ", style="dim")
        t.append(f"running {f.running:g}", style=STATE_COLOURS["running"])
        t.append("  ")
        t.append(f"waiting {f.waiting:g}\n", style=STATE_COLOURS["queued"])
        t.append("KV cache  ", style="dim")
        t.append(bar(f.kv_usage, w), style="bold")
        t.append(f" {f.kv_usage:4.0%}\n")
        if f.num_blocks and f.block_size:
            t.append("          ", style="dim")
            t.append(f"{f.num_blocks} blocks × {f.block_size} tokens\n", style="dim")
        t.append("preempted ", style="dim")
        t.append(f"{f.preemptions:g}", style=STATE_COLOURS["preempted"])
        t.append(f" (+{f.preemptions_recent:g} in {f.window_s:.0f} s)\n" if f.window_s else "\n", style="dim")
        hit = "—" if f.prefix_hit_rate is None else f"{f.prefix_hit_rate:.0%}"
        t.append("prefix cache hits ", style="dim")
        t.append(f"{hit}\n")
        if f.spec_drafts:  # speculative decoding (vLLM's spec_decode series)
            t.append("spec decode ", style="dim")
            kept = "—" if f.spec_acceptance is None else f"{f.spec_acceptance:.0%}"
            t.append(f"drafts kept {kept}")
            if f.spec_per_pos:
                t.append(" · by position " + "/".join(f"{r * 100:.0f}" for r in f.spec_per_pos) + "%", style="dim")
            t.append(f" ({f.spec_drafts:g} drafts)\n", style="dim")
        t.append("tokens/s  ", style="dim")
        t.append(f"prompt {f.prompt_tps:.0f}  generation {f.generation_tps:.0f}\n")
        t.append("TTFT p50/p95 ", style="dim")
        t.append(f"{duration(f.ttft[0])}/{duration(f.ttft[1])}  ")
        t.append("ITL ", style="dim")
        t.append(f"{duration(f.itl[0])}/{duration(f.itl[1])}  ")
        t.append("e2e ", style="dim")
        t.append(f"{duration(f.e2e[0])}/{duration(f.e2e[1])}\n")
        t.append(f"(rates and quantiles over the last {f.window_s:.0f} s)\n", style="dim")
        if self.events_shown:
            t.append("no slot grid, block owners, other clients' text:\n", style="dim italic")
        else:
            t.append("no slot grid, block map, other clients' text:\n", style="dim italic")
        t.append("vLLM keeps those inside (tinyllm serve streams them)", style="dim italic")
        return t
