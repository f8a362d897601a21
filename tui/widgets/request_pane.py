"""One request in full: a header line, then the prompt (dimmed) and the generated text.

The body is a Rich ``Text`` built from plain strings, never markup, so a ``[`` or ``\\`` in
generated text shows literally."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Static

from tinyllm.observe.accounting import Accounting
from tinyllm.observe.snapshot import RequestView
from tinyllm.slo import SLOVerdict, track_waits, view_verdict
from tui.runners.interface import Frame
from tui.widgets.deferred import guarded
from tui.widgets.status import fit_fields
from tui.widgets.style import CACHED, EVENT_STYLES, STATE_STYLES, duration, rid_style
from tui.widgets.text_line import TextLine


def header_text(v: RequestView, now: float, width: int = 10_000, verdict: SLOVerdict | None = None) -> Text:
    """The request's one-line header, fitted to ``width``: whole fields give way, those of least
    use first (it was cut mid-field: `8/8 tok  TTFT` without its value); with --slo, once it
    ended, its verdict (``SLO ✗ ttft (pool)``: the target missed and the reason it waited most)."""
    fields = [(f"#{v.rid} ", rid_style(v.rid), 0), (v.state, STATE_STYLES[v.state], 0)]
    if verdict is not None and verdict.outcome in ("met", "missed"):
        fields.append((f"  SLO {verdict.mark}", "bold green" if verdict.met else "bold red", 0))
    fields += [(f"  slot {v.slot if v.slot is not None else '—'}", "dim", 3), (f"  {v.sampling.describe()}", "", 4)]
    if v.priority:
        fields.append((f"  prio {v.priority}", "", 3))
    if v.tenant:
        fields.append((f"  tenant {v.tenant}", "", 3))
    fields.append((f"  {len(v.tokens)}/{v.max_new_tokens} tok", "", 0))
    if v.ttft_s is not None:
        fields.append((f"  TTFT {duration(v.ttft_s)}", "", 1))
    tps = v.tokens_per_s(now)
    if tps is not None:
        fields.append((f"  {tps:.1f} tok/s", "", 2))
    if v.cached_tokens:
        fields.append((f"  {v.cached_tokens} cached", CACHED, 2))
    if v.preemptions:
        fields.append((f"  preempted {v.preemptions}×", STATE_STYLES["preempted"], 1))
    return fit_fields(fields, width)


def accounting_text(v: RequestView, width: int | None = None) -> Text | None:
    """The request's accounting (the figures ``tinyllm serve`` returns in its ``"tinyllm"``
    field: tinyllm/observe/accounting.py), each phase once it has ended: queue once admitted,
    prefill at the first token, decode and the whole at the last. None before its admission (and
    for recordings made before admissions were recorded). Given a ``width``, the line breaks
    between its figures, never inside one (``total`` at a line's end, ``2.37s`` on the next)."""
    if v.admitted_s is None:
        return None
    a = Accounting.of(
        v.arrival_s,
        v.admitted_s,
        v.first_token_s,
        v.finish_s if v.state == "finished" else None,
        v.preemptions,
        v.cached_tokens,
    )  # a phase not ended yet: None
    parts = [("queue", a.queue_ms), ("prefill", a.prefill_ms), ("decode", a.decode_ms), ("total", a.e2e_ms)]
    figures = [(f"{name} {duration(ms / 1000)}", "dim") for name, ms in parts if ms is not None]
    figures.append((f"preempted {a.preemptions}×", STATE_STYLES["preempted"] if a.preemptions else "dim"))
    figures.append((f"{a.cached_tokens} cached", CACHED if a.cached_tokens else "dim"))
    if v.spec_drafted:  # speculation so far; vLLM's mean acceptance length: tokens a drafted step writes
        figures.append((f"drafts kept {v.spec_kept} of {v.spec_drafted} ({v.spec_kept / v.spec_drafted:.0%})", "dim"))
        figures.append((f"{1 + v.spec_kept / max(1, v.spec_drafts):.2f} tokens a drafted step", "dim"))
    t = Text("\n\n── ", style="dim")
    col = 3
    for i, (figure, style) in enumerate(figures):
        sep = " · " if i else ""
        if i and width is not None and col + len(sep) + cell_len(figure) > width:
            t.append(" ·\n   ", style="dim")  # the next line, under the first figure
            sep, col = "", 3
        t.append(sep, style="dim")
        t.append(figure, style=style)
        col += len(sep) + cell_len(figure)
    return t


def step_text(v: RequestView, batch: tuple[tuple[int, int], ...], step: int) -> Text:
    """What the request did in the step shown: its part of the batch, or why it waited (the
    scheduler's reason). Empty for a request that has ended."""
    t = Text()
    if v.state not in ("queued", "preempted", "running") or step == 0:
        return t
    mine = dict(batch).get(v.rid)
    if mine is not None:
        total = sum(n for _, n in batch)
        t.append(
            f"step {step}: in the batch, {mine} token{'s' * (mine != 1)} "
            f"(of {total}, {len(batch)} request{'s' * (len(batch) != 1)})",
            style="dim",
        )
    elif v.wait:
        t.append(f"step {step}: waiting: {v.wait_detail or v.wait}", style=EVENT_STYLES["wait"])
    if mine is not None and v.last_draft_step == step and v.last_draft:  # speculation: this step's draft
        k, kept = v.last_draft, v.last_kept
        t.append(f"; a draft of {k}: ", style="dim")
        t.append("✓" * kept, style="bold green")
        t.append("✗" * (k - kept), style="strike red")
        t.append(f" {kept} kept, then its own next token", style="dim")
    return t


def choices_text(choices: tuple[tuple[str, float], ...]) -> Text:
    """The latest token and its top alternatives with their probabilities (a request that asked
    for logprobs): the chosen one bold, each coloured by how likely it was."""
    t = Text("latest token: ", style="dim")
    for i, (tok, p) in enumerate(choices):
        if i:
            t.append(" · ", style="dim")
        style = "green" if p >= 0.5 else "yellow" if p >= 0.1 else "red"
        t.append(repr(tok), style=f"bold {style}" if i == 0 else style)
        t.append(f" {100 * p:.0f}%", style="dim")
    return t


NO_REQUEST = "No request selected."
HINT = {
    True: "Type a prompt in the editor at the bottom and press Enter (Ctrl+J: a new line), or pick a "
    "request in the Requests list (Esc, then ↑/↓).",
    False: "Pick one in the Requests list (↑/↓).",
}  # (a replay has no prompt to type)


class RequestPane(Vertical):
    """The selected request: its header line, always in view (it scrolled away with a long
    text), over its prompt and text, which follow the newest token unless scrolled back."""

    DEFAULT_CSS = """
    RequestPane { height: 1fr; }
    RequestPane > #pane-header { height: 1; }
    RequestPane > #pane-scroll { height: 1fr; }
    RequestPane #pane-body { height: auto; }
    """

    def __init__(self, prompts: bool = True, **kw):
        super().__init__(**kw)
        self._hint = Text(HINT[prompts], style="dim")  # under "No request selected.": it wraps
        self.rid: int | None = None
        self._shown: tuple | None = None
        self._plain = ""

    def compose(self):
        header = TextLine(id="pane-header")
        header.text = Text(NO_REQUEST, style="dim")
        yield header
        with VerticalScroll(id="pane-scroll"):
            yield Static(self._hint, id="pane-body", markup=False)

    @property
    def body_text(self) -> str:
        """The plain text shown (prompt + generation), for tests and copy-out."""
        return self._plain

    def accounting_width(self) -> int:
        """The width the accounting line is broken at: the body's, less 2 columns kept for the
        scrollbar a long text brings (it narrows the body after this render, and the line must
        not then break inside a figure)."""
        return max(20, (self.query_one("#pane-body").size.width or self.size.width - 1) - 2)

    def show(self, frame: Frame, rid: int | None, missing: str = "does not exist at this step") -> None:
        """Show request ``rid`` as ``frame`` has it; when the frame has no such request (none
        selected, a replay before its arrival, a server that restarted), say so: the pane never
        keeps a request the frame does not hold."""
        v = frame.snapshot.request(rid) if rid is not None else None
        if v is None:
            key = ("none", rid, missing)
            if key != self._shown:
                self.rid, self._shown, self._plain = rid, key, ""
                self.query_one("#pane-header").set(
                    Text(NO_REQUEST if rid is None else f"#{rid} {missing}", style="dim")
                )
                self.query_one("#pane-body", Static).update(self._hint if rid is None else "")
            return
        prompt = frame.prompts.get(rid, "")
        text = frame.texts.get(rid, "")
        batch = frame.snapshot.batch
        step_line = step_text(v, batch, frame.snapshot.counters.steps)
        choices = frame.choices.get(rid)
        key = (rid, v, text, step_line.plain, choices, self.size.width)
        if key == self._shown:
            return
        scroll = self.query_one("#pane-scroll", VerticalScroll)
        follow = scroll.scroll_y >= scroll.max_scroll_y - 1 or rid != self.rid
        self.rid, self._shown = rid, key
        slo = frame.slos.get(rid) or self.app.slo  # its workload line's own, else --slo
        track = next((t for t in frame.tracks if t.rid == rid), None) if slo is not None else None
        verdict = view_verdict(v, slo, track_waits(track, frame.snapshot.counters.steps))
        self.query_one("#pane-header").set(header_text(v, frame.snapshot.time_s, max(20, self.size.width), verdict))
        body = Text()
        body.append(prompt, style="dim")
        body.append(text)
        if v.state == "aborted":
            body.append("  [aborted]", style=STATE_STYLES["aborted"])
        elif v.state == "failed":
            body.append(f"  [failed: {v.error}]", style=STATE_STYLES["failed"])
        acc = accounting_text(v, self.accounting_width())
        if acc is not None:
            body.append_text(acc)
        if step_line:
            body.append("\n\n── " if acc is None else "\n── ", style="dim")
            body.append_text(step_line)
        if choices:
            body.append("\n── " if acc is not None or step_line else "\n\n── ", style="dim")
            body.append_text(choices_text(choices))
        self._plain = prompt + text
        self.query_one("#pane-body", Static).update(body)
        if follow:
            self.call_after_refresh(guarded(scroll, scroll.scroll_end), animate=False)
