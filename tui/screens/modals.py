"""Small modal screens: help, go-to-step and a confirmation (next-request settings are in
``settings.py``, the prompt-file picker in ``picker.py``)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

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
  '»' = it verified a speculative draft this step (--speculative-config: its pane says how many kept).
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
  hit; '━' green = decoding ('»': a step that verified its speculative draft); 'P' = preempted, then '┄' = waiting to be recomputed; '✓' finished,
  '✗' aborted, '!' failed. Waiting, and why (the scheduler's reason): 's' = no free slot, 'k' = the
  KV pool is full, 'b' = the step's token budget is used up. A column of several steps shows the
  most telling of them. It scrolls back over the whole run, in memory: ← / → move through the
  steps (back to step 0; scrolled back, the window stays on its steps), ↑ / ↓ through the
  rows of the newest 10,000 requests (each row drawn from its request's life, whatever its length).
Replay (tinyllm-tui --replay FILE): the same screen as it was at any step of a recording. space
  plays / pauses, n / . one step on, b / , one back (either pauses it there), g goes to a step,
  ] / [ to the selected request's next / previous admission, preemption, abort or end; + / -
  set the speed. The scrubber line
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
        """(keys, what they do), straight from the bindings: one row per action, with every key
        bound to it (f2 and s both open the settings: "f2 / s  Settings", not two rows)."""
        keys: dict[str, list[str]] = {}
        what: dict[str, str] = {}  # the fullest description (the footer's is the shortest)
        for b in self.app_bindings:
            if b.description:
                shown = keys.setdefault(b.action, [])
                key = b.key_display or pretty_keys(b.key)
                if key not in shown:
                    shown.append(key)
                if len(b.description) > len(what.get(b.action, "")):
                    what[b.action] = b.description
        rows = {" / ".join(k): what[action] for action, k in keys.items()}
        for k, words in self.extra:  # an extra row for keys a binding has says it more fully: one row
            rows[k] = words
        return list(rows.items())

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
            yield Static(paragraphs(self.how_to_read[1]))
            yield Static(Text("\nesc to close", style="dim"))


PALETTE_KEY = ("ctrl+p", "the command palette: every action by name, with its keys")  # (Textual's own binding)


def paragraphs(text: str) -> Text:
    """The help's words as paragraphs the box wraps to its width, each one's label in bold. In the
    source a line that starts with two spaces goes on with the paragraph above (it keeps to 100
    columns); shown as written, a box narrower than that wrapped every line again, raggedly."""
    paras: list[str] = []
    for line in text.strip("\n").splitlines():
        if line.startswith("  ") and paras:
            paras[-1] += " " + line.strip()
        else:
            paras.append(line.strip())
    out = Text()
    for i, para in enumerate(paras):
        label, colon, rest = para.partition(": ")
        out.append("\n" if i else "")
        if colon and len(label) <= 40:
            out.append(label + colon, style="bold")
            out.append(rest)
        else:
            out.append(para)
    return out


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
