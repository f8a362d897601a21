"""One pane of the panes view, drawn as strips: a frame in its state's colour with the request's
title set into the top border, its prompt (dimmed) and text wrapped inside, newest lines last,
and a note in the bottom border (prefill progress, the rate, or why it waits).

``PaneDrawing`` keeps a pane's wrapped text and its line strips between frames: a running
request's text only grows, so a frame re-wraps its last line and re-draws the lines that changed.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip

from tinyllm.units import duration
from tui.widgets.panes_model import Pane
from tui.widgets.panes_text import Wrapped, clean
from tui.widgets.style import DIM, PLAIN, STATE_COLOURS, STATE_STYLES, bar, on, rid_style

ROUND = "╭╮╰╯─│"
HEAVY = "┏┓┗┛━┃"  # the selected request's pane
SEP = " · "


class PaneKey(NamedTuple):
    """Everything a pane's drawing depends on: drawn again only when one of these changed."""

    pane: Pane
    prompt: str
    text: str
    width: int
    height: int
    selected: bool
    tps: float | None  # its decode rate (the bottom border's figure)


def fit(fields: list[tuple[str, Style, int]], width: int) -> list[tuple[str, Style]]:
    """``fields`` (text, style, rank) joined by SEP, dropping the highest ranks first until they
    fit ``width`` cells; what is still too long then ends in "…"."""
    keep = list(fields)
    for rank in sorted({r for _, _, r in fields if r > 0}, reverse=True):
        if sum(len(t) for t, _, _ in keep) + len(SEP) * (len(keep) - 1) <= width:
            break
        keep = [f for f in keep if f[2] != rank]
    out: list[tuple[str, Style]] = []
    used = 0
    for i, (text, style, _) in enumerate(keep):
        if i:
            out.append((SEP, DIM))
            used += len(SEP)
        if used + len(text) > width:
            out.append((text[: max(0, width - used - 1)] + "…", style))
            break
        out.append((text, style))
        used += len(text)
    return out


@lru_cache(maxsize=64)
def border_style(state: str, holds: bool, selected: bool) -> Style:
    """The frame in the state's colour; dimmed once its request has left the slot."""
    return Style(color=STATE_COLOURS.get(state), dim=not holds and not selected, bold=selected)


def title(p: Pane, width: int) -> list[tuple[str, Style]]:
    """The request, its state, tokens so far / max, the slot, TTFT and the slot's blocks (those
    last give way first on a narrow pane)."""
    v = p.view
    if v is None:
        return [(f"slot {p.lane} free", DIM)]
    state = p.state
    label = f"prefill {100 * p.prefill[0] // max(1, p.prefill[1])}%" if p.prefill else state
    fields = [
        (f"#{v.rid}", rid_style(v.rid), 0),
        (label, STATE_STYLES.get(state, PLAIN), 0),
        (f"{len(v.tokens)}/{v.max_new_tokens} tok", PLAIN, 0),
    ]
    if p.slotted:
        fields.append((f"slot {p.lane}" if p.holds else f"slot {p.lane} free", DIM, 1))
    if v.ttft_s is not None:
        fields.append((f"TTFT {duration(v.ttft_s)}", PLAIN, 2))
    if p.blocks is not None:
        fields.append((f"{p.blocks} blk", DIM, 3))
    return fit(fields, max(1, width))


def note(p: Pane, tps: float | None, width: int) -> list[tuple[str, Style]]:
    """The bottom border's words: prefill progress, the decode rate, or why the pane waits."""
    v = p.view
    if v is None or width < 8:
        return []
    if p.prefill is not None:
        done, total = p.prefill
        figures = f" {done}/{total} tok recomputed" if v.preemptions else f" {done}/{total} prompt tok"
        return [
            (
                bar(done / max(1, total), max(0, min(10, width - len(figures))), "▰", "▱") + figures,
                STATE_STYLES["prefill"],
            )
        ]
    if p.holds:
        if v.state == "queued":  # a lane of a server: sent, nothing back yet
            return [("waiting for its first token"[:width], DIM)]
        return [(f"{tps:.1f} tok/s", DIM)] if tps is not None else []
    words = {
        "preempted": f"⇣ waiting: {len(v.prompt) + len(v.tokens)} tokens to recompute",
        "finished": "✓ done · slot free" if p.slotted else "✓ done",
        "aborted": "✗ aborted",
        "failed": f"! failed: {clean(v.error or '')}",
    }.get(v.state, v.state)
    return [(words if len(words) <= width else words[: width - 1] + "…", STATE_STYLES.get(v.state, DIM))]


class PaneDrawing:
    """One lane's drawing, kept between frames."""

    def __init__(self) -> None:
        self.rid: int | None = None
        self.raw = ("", "")  # (prompt, text) as last wrapped
        self.prompt_len = 0  # where the prompt ends in the wrapped source
        self.wrapped = Wrapped(2)
        self.lines: dict[tuple[int, int, bool], Strip] = {}  # (start, end, dimmed) → a text line
        self.key: PaneKey | None = None
        self.strips: list[Strip] = []

    def strips_for(self, key: PaneKey, base: Style) -> list[Strip]:
        """The pane's lines (``key.height`` strips of ``key.width`` cells), drawn again only when
        ``key`` changed."""
        if key != self.key:
            self.key, self.strips = key, self._draw(key, base)
        return self.strips

    def forget(self) -> None:
        """Draw afresh next time (the theme changed)."""
        self.key, self.lines = None, {}

    def _wrap(self, rid: int, prompt: str, text: str, width: int) -> Wrapped:
        """The pane's wrapped text, re-wrapping only what was appended since the last frame."""
        old_prompt, old_text = self.raw
        if rid == self.rid and width == self.wrapped.width and prompt == old_prompt and text.startswith(old_text):
            self.wrapped.extend(clean(text[len(old_text) :]))
        else:
            self.rid, self.wrapped, self.lines = rid, Wrapped(width), {}
            p = clean(prompt)
            self.prompt_len = len(p)
            self.wrapped.reset(p + clean(text))
        self.raw = (prompt, text)
        return self.wrapped

    def _draw(self, key: PaneKey, base: Style) -> list[Strip]:
        p, w, h = key.pane, key.width, key.height
        box = HEAVY if key.selected else ROUND
        edge = on(base, border_style(p.state, p.holds, key.selected))
        inner, rows = max(2, w - 4), max(0, h - 2)
        lines = []
        if p.view is not None and rows:
            lines = self._wrap(p.view.rid, key.prompt, key.text, inner).lines[-rows:]
        strips = [edge_line(box[0:2], box[4], title(p, w - 6), w, edge, base)]
        blank = [Segment(" " * inner, base)]
        for n in range(rows):
            body = self._line(lines[n], inner, not p.holds, base) if n < len(lines) else blank
            strips.append(Strip([Segment(box[5] + " ", edge), *body, Segment(" " + box[5], edge)]))
        if h >= 2:
            strips.append(edge_line(box[2:4], box[4], note(p, key.tps, w - 6), w, edge, base, right=True))
        return [s.crop_extend(0, w, base) for s in strips[:h]]

    def _line(self, span: tuple[int, int], inner: int, dimmed: bool, base: Style) -> list[Segment]:
        """A wrapped line's segments: the prompt's part dimmed (all of it once the request has
        left its slot), padded to ``inner`` cells."""
        hit = self.lines.get((*span, dimmed))
        if hit is None:
            start, end = span
            cut = min(max(start, self.prompt_len), end)
            src = self.wrapped.source
            segs = []
            if cut > start:
                segs.append(Segment(src[start:cut], on(base, DIM)))
            if end > cut:
                segs.append(Segment(src[cut:end], on(base, DIM if dimmed else PLAIN)))
            hit = self.lines[(*span, dimmed)] = Strip(segs).crop_extend(0, inner, base)
        return list(hit)


def edge_line(
    corners: str, fill: str, label: list[tuple[str, Style]], w: int, edge: Style, base: Style, right: bool = False
) -> Strip:
    """A top or bottom border (``corners``: its left and right one) with ``label`` (styled
    pieces) set into it, near its left end or its right."""
    used = sum(len(t) for t, _ in label)
    pad = [Segment(" ", edge)] if label else []
    segs = [Segment(t, on(base, s)) for t, s in label]
    rest = fill * max(0, w - 3 - used - 2 * len(pad))
    if right:
        line = [Segment(corners[0] + rest, edge), *pad, *segs, *pad, Segment(fill + corners[1], edge)]
    else:
        line = [Segment(corners[0] + fill, edge), *pad, *segs, *pad, Segment(rest + corners[1], edge)]
    return Strip(line).crop_extend(0, w, base)
