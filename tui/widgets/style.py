"""One fixed colour per request state, and a palette to tell requests apart in the block map.

Mid-luminance colours, readable on dark and light themes alike."""

from __future__ import annotations

from functools import lru_cache

from rich.style import Style

from tinyllm.request import KV_DTYPE_SHORT, kv_dtype_tag
from tinyllm.units import duration  # noqa: F401  (the screen's panels import it from here)

STATE_COLOURS = {
    "queued": "#c08a00",
    "running": "#2a9d4a",
    "preempted": "#b23fd0",
    "finished": "#3b78d8",
    "aborted": "#d03a3a",
    "failed": "#ff2d55",
    "prefill": "#1fa8b8",  # a running request whose prompt is still being computed (chunks)
}
STATE_STYLES = {k: Style(color=v, bold=True) for k, v in STATE_COLOURS.items()}
EVENT_STYLES = {
    "submit": Style(color=STATE_COLOURS["queued"]),
    "admit": Style(color=STATE_COLOURS["running"]),
    "prefill": Style(color=STATE_COLOURS["prefill"]),
    "preempt": Style(color=STATE_COLOURS["preempted"], bold=True),
    "finish": Style(color=STATE_COLOURS["finished"]),
    "abort": Style(color=STATE_COLOURS["aborted"]),
    "error": Style(color=STATE_COLOURS["aborted"], bold=True),
    "info": Style(dim=True),
    "wait": Style(color=STATE_COLOURS["queued"], italic=True),
}
REQUEST_PALETTE = (
    "#e6194b",
    "#3cb44b",
    "#d4a600",
    "#4363d8",
    "#f58231",
    "#911eb4",
    "#1fa8b8",
    "#c02ab0",
    "#6b8e23",
    "#9a6324",
    "#008080",
    "#7f5fd8",
)


RID_STYLES = tuple(Style(color=c, bold=True) for c in REQUEST_PALETTE)
DIM = Style(dim=True)
CACHED = Style(color="#1fa8b8", bold=True)  # tokens / blocks served by the prefix cache
PLAIN = Style()


def rid_style(rid: int) -> Style:
    return RID_STYLES[rid % len(RID_STYLES)]


@lru_cache(maxsize=1024)
def on(base: Style, style: Style) -> Style:
    """``style`` over a widget's base style; cached, as line-API widgets call it per segment."""
    return base + style


def bar(frac: float, width: int, full: str = "█", empty: str = "░") -> str:
    """A text bar with eighth-block resolution at the end."""
    frac = min(1.0, max(0.0, frac))
    eighths = round(frac * width * 8)
    n_full, rem = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[rem] if rem and n_full < width else ""
    s = full * n_full + partial
    return s + empty * (width - len(s))


def dtype_short(name: str) -> str:
    """A K/V element type as the screen writes it: ``fp32``, ``bf16`` (others as given)."""
    return KV_DTYPE_SHORT.get(name, name)


def dtype_tag(kv) -> str:
    """A KVView's element type where it is not float32 (``bf16``; request.kv_dtype_tag)."""
    return kv_dtype_tag(kv.dtype)
