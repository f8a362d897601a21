"""Modal screens: help, next-request settings, the prompt-file picker, go-to-step and a confirmation."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from tinyllm.request import MAX_LOGPROBS, PRIORITY_LIMIT, SEED_MAX, SEED_MIN, RequestSettings, Sampling, check_tenant
from tinyllm.stops import format_stop_list, parse_stop_list
from tinyllm.workload import (
    WorkItem,
    WorkloadError,
    bundled_workloads,
    load_workload,
    resolve_workload,
    tokenize_checked,
)
from tui.widgets.ordered_input import OrderedInput

HOW_TO_READ = """\
Keys: the app starts in the prompt editor (the line at the bottom), where every letter is text:
  Enter sends exactly what is there, Ctrl+J starts a new line, ↑ in an empty editor brings back
  the prompts sent before. Esc leaves it for the Requests list, where the letter keys below act
  (q, space, t, x...); i, / or Enter come back. The footer shows the keys of wherever you are.
Slots: one cell per KV slot: slot number, the request holding it (#id, one colour per request),
  a bar of how full its context is, and its context length in tokens. '+' = admitted this step;
  '✓ done', '⇣ preempt', '✗ aborted' = freed this step. 'free' = nobody holds it.
  '▸' and a cyan bar = still prefilling (chunked prefill: its prompt is computed over several steps).
Blocks (paged KV only): one square per KV block, coloured like the request that owns it; '·' = free;
  '▣' = shared by several requests (a cached prefix in use); '○' = free but still holding a cached
  prefix (the next prompt that starts with it revives it; evicted oldest first when room is needed).
KV: used/reserved = real tokens vs memory held; alloc/reserved (paged) = blocks claimed;
  used/alloc = how much of what requests claimed they really use; fp32 / bf16 = what each K/V
  value is kept in (--kv-cache-dtype bfloat16: half the bytes, twice the tokens a MiB holds).
Requests: every request, finished and aborted ones too. Highlight one to show it on the right.
States: queued (waiting for a slot), running (in a slot), preempted (evicted for lack of blocks,
  will be recomputed), finished, aborted.
Log: admissions, prefill chunks (when a prompt takes several steps), preemptions, finishes,
  aborts and failures as the engine reports them, with the engine step number. It keeps the
  last 10,000 events in memory (no --record needed): e (or Tab, or a click) then ↑ / ↓, PgUp /
  PgDn, Home / End or the mouse wheel scroll it back; End follows the newest again.
Timeline (t): one row per request, one column per engine step (z / Z: more / fewer steps per
  column), the newest step on the right. '░' yellow = queued; '▓' cyan = a prefill chunk computed
  in that step ('░' cyan: admitted, waiting for its next chunk); '◆' = admitted with a prefix-cache
  hit; '━' green = decoding; 'P' = preempted, then '┄' = waiting to be recomputed; '✓' finished,
  '✗' aborted, '!' failed. Waiting, and why (the scheduler's reason): 's' = no free slot, 'k' = the
  KV pool is full, 'b' = the step's token budget is used up. A column of several steps shows the
  most telling of them. It scrolls back over the whole run, in memory: ← / → move through the
  steps (back to step 0; scrolled back, the window stays on its steps), ↑ / ↓ through the
  rows of the newest 10,000 requests (each row drawn from its request's life, whatever its length).
Replay (tinyllm-tui --replay FILE): the same screen as it was at any step of a recording. space
  plays / pauses, n / . one step on, b / , one back, g goes to a step, ] / [ to the selected
  request's next / previous admission, preemption or end; + / - set the speed. The scrubber line
  at the bottom shows where you are ('P' marks steps with preemptions, 'x' with aborts).
Attached (tinyllm-tui --attach URL): to tinyllm serve, every panel is the server's engine (all
  clients' requests); typed prompts go to its /v1/completions; x aborts this app's requests, and
  another client's after a yes. To a vLLM server, its /metrics replace the slot and KV panels,
  and the list shows this app's requests. The server paces itself: pause, step and speed are off."""


class HelpScreen(ModalScreen[None]):
    """Every key (straight from the bindings: the one source of truth) and how to read the
    screen. The main app and the race each show theirs with it."""

    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; background: $background 60%; }
    #help-box { width: 90%; max-width: 110; height: 90%; border: thick $primary; background: $surface;
                padding: 1 2; }
    """

    def __init__(
        self,
        bindings: list[Binding],
        title: str = "tinyllm-tui — keys",
        how_to_read: tuple[str, str] = ("How to read the screen", HOW_TO_READ),
        extra: tuple[tuple[str, str], ...] = (("enter", "submit the prompt in the input"),),
    ):
        super().__init__()
        self.app_bindings, self.title_text, self.how_to_read, self.extra = bindings, title, how_to_read, extra

    def rows(self) -> list[tuple[str, str]]:
        """(keys, what they do), straight from the bindings."""
        out = [(b.key_display or pretty_keys(b.key), b.description) for b in self.app_bindings if b.description]
        return out + list(self.extra)

    def compose(self) -> ComposeResult:
        keys = Table(show_header=True, header_style="bold", box=None, padding=(0, 2))
        keys.add_column("keys")
        keys.add_column("what")
        for k, what in self.rows():
            keys.add_row(Text(k), Text(what))
        with VerticalScroll(id="help-box"):
            yield Static(Text(self.title_text, style="bold"))
            yield Static(keys)
            yield Static(Text("\n" + self.how_to_read[0], style="bold"))
            yield Static(Text(self.how_to_read[1]))
            yield Static(Text("\nesc to close", style="dim"))


def pretty_keys(keys: str) -> str:
    names = {
        "question_mark": "?",
        "space": "space",
        "escape": "esc",
        "plus": "+",
        "minus": "-",
        "full_stop": ".",
        "equals_sign": "=",
        "comma": ",",
        "left_square_bracket": "[",
        "right_square_bracket": "]",
        "less_than_sign": "<",
        "greater_than_sign": ">",
    }
    return " / ".join(names.get(k, k) for k in keys.split(","))


class SettingsScreen(ModalScreen["RequestSettings | None"]):
    """Validated fields; a wrong value is explained here and nothing is applied."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        # priority: the focus moves before the next key is handed out (as a field's
        # binding, keys typed right after Tab, or pasted, went to the field it left)
        Binding("tab", "app.focus_next", "Next field", show=False, priority=True),
        Binding("shift+tab", "app.focus_previous", "Previous field", show=False, priority=True),
    ]

    def __init__(self, current: RequestSettings, max_new_limit: int, engine: str = ""):
        """``engine``: the engine's own settings (scheduler, KV), shown read-only: they are fixed
        when the engine is built, so the line says which flags change them."""
        super().__init__()
        self.current = current
        self.max_new_limit = max_new_limit
        self.engine = engine

    def compose(self) -> ComposeResult:
        s = self.current.sampling
        with Vertical(id="settings-box"):
            yield Label("Settings for the next request", id="settings-title")
            for label, ident, value, hint in (
                ("temperature", "temperature", f"{s.temperature:g}", "0 = greedy, any number >= 0"),
                ("top_k", "top_k", "" if s.top_k is None else str(s.top_k), "integer >= 1, blank = off"),
                ("top_p", "top_p", "" if s.top_p is None else f"{s.top_p:g}", "number in (0, 1], blank = off"),
                (
                    "max_new_tokens",
                    "max_new",
                    str(self.current.max_new_tokens),
                    f"integer in [1, {self.max_new_limit}]",
                ),
            ):
                with Horizontal(classes="field compact" if ident == "max_new" else "field"):  # 80x24: one row
                    yield Label(label, classes="field-label")
                    yield OrderedInput(value, id=ident, classes="field-input")
                    yield Label(hint, classes="field-hint")
            c = self.current
            seed = "" if s.seed is None else str(s.seed)
            for pair in (
                (("min_p", f"{s.min_p:g}"), ("seed", seed)),
                (("presence_penalty", f"{s.presence_penalty:g}"), ("frequency_penalty", f"{s.frequency_penalty:g}")),
                (("repetition_penalty", f"{s.repetition_penalty:g}"), ("min_tokens", str(c.min_tokens))),
            ):
                with Horizontal(classes="field compact"):
                    for ident, value in pair:
                        yield Label(ident.replace("_penalty", " pen."), classes="field-label")
                        yield OrderedInput(value, id=ident, classes="field-input")
            with Horizontal(classes="field compact"):
                yield Label("stop  a|b \\n", classes="field-label")  # stop strings: | between, \n newline
                yield OrderedInput(format_stop_list(c.stop), id="stop", classes="field-input stop-input")
                yield Label("logprobs", classes="field-label")
                yield OrderedInput("" if c.logprobs is None else str(c.logprobs), id="logprobs", classes="field-input")
            with Horizontal(classes="field compact"):
                yield Label("priority", classes="field-label")
                yield OrderedInput(str(c.priority), id="priority", classes="field-input")
                yield Label("tenant", classes="field-label")
                yield OrderedInput(c.tenant, id="tenant", classes="field-input")
            yield Checkbox("stop at end-of-text", self.current.stop_at_eos, id="stop_at_eos")
            if self.engine:
                yield Static(Text(self.engine, style="dim"), id="settings-engine")
            yield Static("", id="settings-error", markup=False)
            with Horizontal(id="settings-buttons"):
                yield Button("Apply", variant="primary", id="apply")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#temperature", Input).focus()

    def parse(self) -> RequestSettings:
        """The settings in the form, or ValueError saying which field is wrong and why."""

        def val(ident: str) -> str:
            return self.query_one(f"#{ident}", Input).value.strip()

        def num(ident: str, kind, blank_ok: bool, ok, allowed: str):
            """The field's value, or ValueError in the dialog's own words (its hint's)."""
            raw = val(ident)
            if raw == "" and blank_ok:
                return None
            name = ident.replace("max_new", "max_new_tokens")
            try:
                x = kind(raw)
            except ValueError:
                x = None
            if x is None or not ok(x):
                raise ValueError(f"{name} must be {allowed}, got {raw!r}")
            return x

        sampling = Sampling(
            num("temperature", float, False, lambda t: 0 <= t < float("inf"), "a number >= 0 (0 = greedy)"),
            num("top_k", int, True, lambda k: k >= 1, "a whole number >= 1, or blank for off"),
            num("top_p", float, True, lambda p: 0 < p <= 1, "a number in (0, 1], or blank for off"),
        )
        new = num(
            "max_new",
            int,
            False,
            lambda n: 1 <= n <= self.max_new_limit,
            f"a whole number from 1 to {self.max_new_limit}",
        )
        pen = "a number from -2 to 2 (0 = off)"
        sampling = replace(
            sampling,
            min_p=num("min_p", float, False, lambda x: 0 <= x <= 1, "a number in [0, 1] (0 = off)"),
            seed=num("seed", int, True, lambda x: SEED_MIN <= x <= SEED_MAX, "a whole number, or blank for none"),
            presence_penalty=num("presence_penalty", float, False, lambda x: -2 <= x <= 2, pen),
            frequency_penalty=num("frequency_penalty", float, False, lambda x: -2 <= x <= 2, pen),
            repetition_penalty=num(
                "repetition_penalty", float, False, lambda x: 0 < x < float("inf"), "a number > 0 (1 = off)"
            ),
        )
        min_tokens = num(
            "min_tokens", int, False, lambda x: 0 <= x <= new, f"a whole number from 0 to max_new_tokens ({new})"
        )
        priority = num(
            "priority",
            int,
            False,
            lambda x: -PRIORITY_LIMIT < x < PRIORITY_LIMIT,
            "a whole number (lower runs first under --scheduling-policy priority)",
        )
        tenant = check_tenant(val("tenant"))
        return replace(
            self.current,
            sampling=sampling,
            max_new_tokens=new,
            stop=parse_stop_list(val("stop")),
            stop_at_eos=self.query_one("#stop_at_eos", Checkbox).value,
            min_tokens=min_tokens,
            priority=priority,
            tenant=tenant,
            logprobs=num(
                "logprobs",
                int,
                True,
                lambda x: 0 <= x <= MAX_LOGPROBS,
                f"a whole number from 0 to {MAX_LOGPROBS}, or blank for off",
            ),
        )

    def _apply(self) -> None:
        try:
            settings = self.parse()
        except ValueError as e:
            self.query_one("#settings-error", Static).update(Text(f"✗ {e}", style="bold red"))
            return
        self.dismiss(settings)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "apply":
            self._apply()
        else:
            self.dismiss(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._apply()

    def action_cancel(self) -> None:
        self.dismiss(None)


class GotoStep(ModalScreen["int | None"]):
    """Ask for an engine step to jump to (a replay)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, current: int, last: int):
        super().__init__()
        self.current, self.last = current, last

    def compose(self) -> ComposeResult:
        with Vertical(id="settings-box"):
            yield Label(f"Go to step (0–{self.last}; now {self.current})", id="settings-title")
            yield OrderedInput(str(self.current), id="goto-step", classes="field-input", select_on_focus=True)
            yield Static("", id="settings-error")

    def on_mount(self) -> None:
        self.query_one("#goto-step", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text.isdecimal() or int(text) > self.last:
            self.query_one("#settings-error", Static).update(
                Text(f"a step is a whole number from 0 to {self.last}, got {text!r}", style="bold red")
            )
            return
        self.dismiss(int(text))

    def action_cancel(self) -> None:
        self.dismiss(None)


class Confirm(ModalScreen[object]):
    """Ask before something that reaches other people (aborting another client's request):
    ``choices`` are (key, label, result); a key or its button picks one, Esc cancels (None)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, message: str, choices: list[tuple[str, str, object]]):
        super().__init__()
        self.title_text, self.message, self.choices = title, message, choices

    def compose(self) -> ComposeResult:
        with Vertical(id="settings-box"):
            yield Label(self.title_text, id="settings-title")
            yield Static(Text(self.message), id="confirm-message")
            with Horizontal(id="settings-buttons"):
                for i, (key, label, _) in enumerate(self.choices):
                    yield Button(f"{label} ({key})", id=f"choice-{i}", variant="error" if i == 0 else "default")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()  # Enter on its own changes nothing

    def on_key(self, event) -> None:
        for key, _, result in self.choices:
            if event.key == key:
                event.stop()
                self.dismiss(result)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        ident = event.button.id or ""
        self.dismiss(self.choices[int(ident.split("-")[1])][2] if ident.startswith("choice-") else None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class QuitConfirm(Confirm):
    """Quit with requests running or a recording open: y, or the quit key again, quits (the
    app's action_quit sees this dialog and confirms it); Esc or Enter stays."""

    def __init__(self, lost: list[str]):
        super().__init__(
            "Quit?",
            "\n".join(f"• {why}" for why in lost) + "\n\nq or Ctrl+C again, or y, quits; Esc stays.",
            [("y", "Quit", True)],
        )

    def on_key(self, event) -> None:
        """q quits too (Ctrl+C / Ctrl+Q: the app's own keys, with priority); y: Confirm's."""
        if event.key == "q":
            event.stop()
            event.prevent_default()  # (Textual calls Confirm.on_key next otherwise)
            self.dismiss(True)


@dataclass(frozen=True)
class LoadedWorkload:
    path: Path
    items: tuple[WorkItem, ...]
    tokens: tuple[tuple[int, ...], ...]


def read_workload(path: Path, encode, max_len: int, default_new: int) -> LoadedWorkload:
    """Parse + check a prompt file completely; WorkloadError with file:line on any problem."""
    items = load_workload(path)
    ids = tokenize_checked(items, path, encode, max_len, default_new)
    return LoadedWorkload(path, tuple(items), tuple(tuple(i) for i in ids))


class PromptPicker(ModalScreen["LoadedWorkload | None"]):
    """Type a path (or a bundled workload's name) and press Enter, or pick a bundled workload
    (shipped inside the package) below; a bad file is refused whole, with its line. Focus starts
    in the path field, so typing goes where the dialog says; a letter typed on the list goes
    there too; ↓ / Tab go to the list, where Enter loads the one highlighted."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        # priority: the field would take ↓ as a scroll; off on the list (its own ↓)
        Binding("down", "to_list", "The bundled workloads", show=False, priority=True),
    ]

    def __init__(self, encode, max_len: int, default_new: int):
        super().__init__()
        self.encode, self.max_len, self.default_new = encode, max_len, default_new
        self.files = list(bundled_workloads().values())

    def compose(self) -> ComposeResult:
        with Vertical(id="picker-box"):
            yield Label("Load a prompt workload (JSONL)", id="picker-title")
            yield OrderedInput(
                placeholder="type a path to a .jsonl file (or a bundled name) and press Enter",
                id="picker-path",
                select_on_focus=False,
            )  # (a letter from the list: added to)
            yield Static("", id="picker-error", markup=False)
            yield Label("…or pick a bundled one (↓ or Tab, then Enter):", id="picker-or")
            yield OptionList(
                *[Option(Text(f"{p.name}  ({_count_lines(p)} requests)"), id=str(p)) for p in self.files],
                id="picker-list",
            )

    def on_mount(self) -> None:
        self.set_focus(self.query_one("#picker-path"))

    def _try(self, path: Path) -> None:
        try:
            loaded = read_workload(path, self.encode, self.max_len, self.default_new)
        except WorkloadError as e:
            self._error(str(e))
            return
        self.dismiss(loaded)

    def _error(self, text: str) -> None:
        self.query_one("#picker-error", Static).update(Text(f"✗ {text}\nnothing was loaded", style="bold red"))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self._try(Path(event.option.id))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        typed = event.value.strip()
        if not typed:
            self._error("type a path to a .jsonl file first, or pick a bundled workload below (↓, Enter)")
            return
        roots = picker_roots()
        if roots and typed not in {p.stem for p in self.files} and not within(Path(typed), roots):
            # (said before looking: whether such a file exists is not told to a web visitor)
            self._error(f"{typed}: outside the folders this app reads files from ({', '.join(map(str, roots))})")
            return
        try:
            path = resolve_workload(typed)  # a file, else a bundled workload's name
        except WorkloadError:
            where = "" if Path(typed).expanduser().is_absolute() else f" (a relative path starts in {Path.cwd()})"
            self._error(f"{typed}: no such file{where}, nor a bundled workload's name (those are below)")
            return
        self._try(path)

    def on_key(self, event) -> None:
        """A letter typed on the list goes to the path field, as the dialog says."""
        field = self.query_one("#picker-path", Input)
        if event.is_printable and self.focused is not field:
            event.stop()
            self.set_focus(field)
            field.insert_text_at_cursor(event.character)

    def check_action(self, action: str, parameters) -> bool | None:
        if action == "to_list":
            return bool(self.files) and self.focused is self.query_one("#picker-path")
        return True

    def action_to_list(self) -> None:
        self.set_focus(self.query_one("#picker-list"))

    def action_cancel(self) -> None:
        self.dismiss(None)


def _count_lines(p: Path) -> int:
    try:
        return sum(1 for line in p.read_text(encoding="utf-8").splitlines() if line.strip())
    except (OSError, UnicodeDecodeError):
        return 0


PICKER_ROOTS_ENV = "TINYLLM_PICKER_ROOTS"  # set by tinyllm-tui --web for the apps it serves (tui/web.py)


def picker_roots() -> list[Path]:
    """The folders F3 may read typed paths from (None set: anywhere, as in a terminal of your own)."""
    value = os.environ.get(PICKER_ROOTS_ENV, "")
    return [Path(p).resolve() for p in value.split(os.pathsep) if p]


def within(path: Path, roots: list[Path]) -> bool:
    """Whether ``path`` (relative: from the working directory; links followed) is in one of ``roots``."""
    real = path.expanduser().resolve()
    return any(real == root or real.is_relative_to(root) for root in roots)
