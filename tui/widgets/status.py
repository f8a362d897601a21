"""The status line and the replay's scrubber: one line each, built from a frame and the runner.

The status line is a list of fields, each with a rank; on a narrow screen the highest ranks give
way first, so the mode and the step counter stay at any width (``fit_fields``)."""

from __future__ import annotations

from pathlib import Path

from rich.cells import cell_len
from rich.text import Text

from tinyllm.units import count
from tui.runners.interface import Frame
from tui.widgets.style import dtype_tag


def status_fields(f: Frame, runner, model_name: str, recording: Path | None = None) -> list[tuple[str, str, int]]:
    """(text, style, rank) per field, in screen order; a higher rank gives way first. What the
    fields are depends on the runner's mode: a live engine, a replay, a server."""
    steps = f.snapshot.counters.steps
    if f.status == "loading":
        waiting = getattr(runner, "early_prompts", 0)
        told = (
            (f" · {count(waiting, 'prompt')} wait{'s' * (waiting == 1)} for the engine", "bold yellow", 1)
            if waiting
            else (" · i, then type a prompt: it is sent when the engine is ready", "dim", 3)
        )
        return [
            (" ⧗ LOADING ", "bold reverse cyan", 0),
            (f" {model_name}", "bold", 1),
            (" · engine loading (importing torch, reading the weights)…", "bold", 2),
            told,
        ]
    if runner.mode in ("attach", "metrics"):
        r = runner
        down = f.status.startswith("disconnected")
        out = [
            (" ✗ DISCONNECTED " if down else " ⇄ ATTACHED ", "bold reverse red" if down else "bold reverse blue", 0),
            (f" {r.kind} at {r.url}", "bold", 2),
            (f" · {model_name}", "bold", 4),
        ]
        gone = [(f" · {f.status.removeprefix('disconnected: ')} · last state shown", "bold red", 1)] * down
        if runner.mode == "metrics":  # a "step" here is a second since attach
            return (
                out
                + gone
                + [(f" · metrics every {r.poll_s:g} s", "dim", 3), (" · this app's requests stream below", "dim", 5)]
            )
        out.append((f" · step {steps}", "bold", 0))
        if down:
            return out + gone
        return out + [(f" · {f.snapshot.n_slots} slots", "dim", 3), *settings_fields(f.snapshot, "dim")]
    if runner.mode == "replay":
        return [
            (" ⏸ REPLAY " if f.paused else " ▶ REPLAY ", "bold reverse magenta", 0),
            (f" step {steps} of {runner.last_step}", "bold", 0),
            (f" · {runner.path.name}", "bold", 2),
            (f" · {model_name}", "bold", 4),
            *settings_fields(f.snapshot, "dim"),
            (f" · {speed(f)}", "dim", 3),
            (" · read-only", "dim", 6),
        ]
    n = runner.threads
    snap = f.snapshot
    idle = not (snap.busy or f.pending_arrivals)
    if f.paused:
        state = (" ⏸ PAUSED ", "bold reverse yellow")
    elif idle:  # nothing to run: the engine waits for a request
        state = (" ● IDLE ", "bold reverse blue")
    else:
        state = (" ▶ RUNNING ", "bold reverse green")
    out = [(*state, 0), (f" step {steps}", "bold", 0)]
    if recording is not None:
        out.append((f" · ● REC {recording.name}", "bold red", 1))
    if f.pending_arrivals:
        out.append((f" · {f.pending_arrivals} arriving", "yellow", 1))
    return out + [
        (f" · delay {f.step_delay_ms} ms/step", "dim", 2),
        (f" · {model_name}", "bold", 3),
        *settings_fields(f.snapshot, "bold"),
        (f" · {runner.device}", "dim", 6),
        (f" · {n} thread{'s' if n != 1 else ''}" if n else " · ? threads", "dim", 7),
    ]


def settings_fields(snap, style: str) -> list[tuple[str, str, int]]:
    """The engine's KV layout, scheduling policy and scheduler, in every mode: what another run
    could set otherwise (a policy other than fcfs is news, so it gives way later)."""
    budget = snap.max_batched_tokens
    k = getattr(snap, "speculative", 0)
    who = "draft model" if getattr(snap, "speculative_method", "ngram") == "draft_model" else "ngram"
    error = getattr(snap, "speculative_error", "")
    spec = [] if not k else [
        (" · spec off: batch too large" if snap.speculative_off else f" · spec k={k} {who}", "bold", 3)
    ] + ([(f" · drafts failed: {error}", "bold red", 1)] if error else [])  # fmt: skip
    return [
        (f" · {kv_label(snap.kv)}", style, 5),
        (f" · {snap.policy}", "bold", 4 if snap.policy == "fcfs" else 2),
        (f" · {'chunked ≤' + str(budget) + ' tok/step' if budget else 'prefill+decode'}", style, 4),
        *spec,
    ]


def kv_label(kv) -> str:
    """``paged KV``, with the element type where it is not float32 (``paged KV bf16``)."""
    return f"{kv.kind} KV {dtype_tag(kv)}".rstrip()


def speed(f: Frame) -> str:
    return f"{f.step_delay_ms} ms/step" if f.step_delay_ms else "recorded pace"


def scrubber(f: Frame, runner, width: int, selected: int | None) -> Text:
    """▶ step 120/734 ━━━━━━●───P──x── : where the replay is, and where things went wrong."""
    r = runner
    last, now = max(1, r.last_step), f.snapshot.counters.steps
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(" ⏸ " if f.paused else " ▶ ", style="bold")
    t.append(f"step {now:>{len(str(r.last_step))}}/{r.last_step} ", style="bold")  # one width: the bar's
    # cells, and its marks, never move
    sel = f"#{selected}" if selected is not None else "the selected request"
    keys = f" {speed(f)} · space play · n/b step · g go to · ]/[ events of {sel}"
    if width < 2 * len(keys):
        keys = f" {speed(f)} · ? keys"
    cells = max(10, width - len(t) - len(keys))
    marks = {}
    for kind, glyph, style in (("aborted", "x", "bold red"), ("preempted", "P", "bold magenta")):
        for s in r.event_steps((kind,)):
            marks[min(cells - 1, s * cells // (last + 1))] = (glyph, style)
    here = min(cells - 1, now * cells // (last + 1))
    for c in range(cells):
        if c == here:
            t.append("●", style="bold reverse")
        elif c in marks:
            t.append(*marks[c])
        else:
            t.append("━" if c < here else "─", style="cyan" if c < here else "dim")
    t.append(keys, style="dim")
    return t


def fit_fields(fields: list[tuple[str | Text, str, int]], width: int) -> Text:
    """One line of ``fields`` (text, style, rank) in their order, dropping the highest ranks
    first until it fits ``width`` cells (rank 0 always stays; a line still too long ends in …).
    A field's text may be a ``Text`` styled in parts (its style is then not used)."""
    keep = list(fields)
    for rank in sorted({r for _, _, r in fields if r > 0}, reverse=True):
        if _line_cells([t for t, _, _ in keep]) <= width:
            break
        keep = [f for f in keep if f[2] != rank]
    t = Text(no_wrap=True, overflow="ellipsis")
    for i, (text, style, _) in enumerate(keep):
        if isinstance(text, Text):
            t.append(text)
            continue
        if i == 1 and text.startswith(" · ") and str(keep[0][0]).endswith(" "):  # the field between them
            text = text[3:]  # gave way: no separator alone
        t.append(text, style=style)
    if t.cell_len > width:  # over only by a separator's trailing space: not a cut field
        t.rstrip()
    return t


def _line_cells(texts: list[str | Text]) -> int:
    """The cells ``texts`` take in a row, less the last one's trailing spaces (a separator)."""
    return cell_len("".join(t.plain if isinstance(t, Text) else t for t in texts).rstrip(" "))
