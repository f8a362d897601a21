"""One request in full: a header line, then the prompt (dimmed) and the generated text.

The body is a Rich ``Text`` built from plain strings, never markup, so a ``[`` or ``\\`` in
generated text shows literally."""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from tinyllm.observe.snapshot import RequestView
from tui.runners.interface import Frame
from tui.widgets.style import CACHED, STATE_STYLES, duration, rid_style
from tui.widgets.text_line import TextLine


def header_text(v: RequestView, now: float) -> Text:
    h = Text(no_wrap=True, overflow="ellipsis")
    h.append(f"#{v.rid} ", style=rid_style(v.rid))
    h.append(v.state, style=STATE_STYLES[v.state])
    h.append(f"  slot {v.slot if v.slot is not None else '—'}", style="dim")
    h.append(f"  {v.sampling.describe()}")
    h.append(f"  {len(v.tokens)}/{v.max_new_tokens} tok")
    if v.ttft_s is not None:
        h.append(f"  TTFT {duration(v.ttft_s)}")
    tps = v.tokens_per_s(now)
    if tps is not None:
        h.append(f"  {tps:.1f} tok/s")
    if v.cached_tokens:
        h.append(f"  {v.cached_tokens} cached", style=CACHED)
    if v.preemptions:
        h.append(f"  preempted {v.preemptions}×", style=STATE_STYLES["preempted"])
    return h


NO_REQUEST = "No request selected. Type a prompt below and press Enter."


class RequestPane(VerticalScroll):
    DEFAULT_CSS = """
    RequestPane { height: 1fr; }
    RequestPane > #pane-header { height: 1; }
    RequestPane > #pane-body { height: auto; }
    """

    def __init__(self, **kw):
        super().__init__(**kw)
        self.rid: int | None = None
        self._shown: tuple | None = None
        self._plain = ""

    def compose(self):
        header = TextLine(id="pane-header")
        header.text = Text(NO_REQUEST, style="dim")
        yield header
        yield Static("", id="pane-body", markup=False)

    @property
    def body_text(self) -> str:
        """The plain text shown (prompt + generation), for tests and copy-out."""
        return self._plain

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
                    Text(NO_REQUEST if rid is None else f"#{rid} {missing}", style="dim"))
                self.query_one("#pane-body", Static).update("")
            return
        prompt = frame.prompts.get(rid, "")
        text = frame.texts.get(rid, "")
        key = (rid, v, text)
        if key == self._shown:
            return
        follow = self.scroll_y >= self.max_scroll_y - 1 or rid != self.rid
        self.rid, self._shown = rid, key
        self.query_one("#pane-header").set(header_text(v, frame.snapshot.time_s))
        body = Text()
        body.append(prompt, style="dim")
        body.append(text)
        if v.state == "aborted":
            body.append("  [aborted]", style=STATE_STYLES["aborted"])
        elif v.state == "failed":
            body.append(f"  [failed: {v.error}]", style=STATE_STYLES["failed"])
        self._plain = prompt + text
        self.query_one("#pane-body", Static).update(body)
        if follow:
            self.call_after_refresh(self.scroll_end, animate=False)
