"""The prompt editor: what the user types is what is sent.

A multi-line ``TextArea`` at the bottom of the app. Enter sends; Ctrl+J (every terminal sends it
as a line feed) inserts a newline, as do Shift+Enter, Alt+Enter and Ctrl+Enter where the terminal
reports them (kitty's keyboard protocol: kitty, WezTerm, foot, Ghostty; most other terminals send
Alt+Enter and Shift+Enter as a plain Enter); a paste keeps every line. ↑ in an empty editor
brings back the prompts sent before, newest first, and ↓ goes forward again, as in a shell.

Every key is handled here, in the order it came. Textual runs a focused widget's key bindings
(backspace, the arrows, Enter) only once the key has bubbled back up to the app, behind keys
the app has already handed on; so a burst of keys (a fast typist, a terminal replaying its
input, a test) came out of order: ``hello``, five backspaces, ``ROMEO:``, Enter sent
``"helloR"``, and three prompts typed with Enter during LOADING went as three copies of all three
run together. Here Enter takes the text of that moment, hands it to ``submit`` (which sends it,
or says why not and returns False: the text then stays) and clears the editor before the next
key is read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from textual import events
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.reactive import reactive
from textual.widgets import TextArea
from textual.widgets._toast import ToastRack

from tui.widgets.deferred import deferred
from tui.widgets.status import fit_fields

APP_KEYS = frozenset({"f6", "f7", "ctrl+x", "ctrl+c", "ctrl+k"})  # the app's priority keys a TextArea binds
SEND_KEYS = frozenset({"enter"})
NEWLINE_KEYS = frozenset({"ctrl+j", "newline", "shift+enter", "alt+enter", "ctrl+enter"})
HISTORY_SIZE = 200  # prompts kept for ↑, oldest dropped first
PLACEHOLDER = "Type a prompt · Enter sends · Ctrl+J new line · ↑ earlier prompts · Esc: keys (F1: all)"
# its parts, each with a rank: a narrow editor drops the highest first, whole (never "Type a prom")
HINTS = (
    ("Type a prompt", 0),
    ("Enter sends", 1),
    ("Ctrl+J new line", 2),
    ("↑ earlier prompts", 4),
    ("Esc: keys (F1: all)", 3),
)


def placeholder(width: int) -> str:
    """The editor's hint for ``width`` cells: the parts that fit, most useful first."""
    fields = [(text if i == 0 else f" · {text}", "", rank) for i, (text, rank) in enumerate(HINTS)]
    return fit_fields(fields, width).plain


def _without(bindings, keys: frozenset[str]) -> list[Binding]:
    """``bindings`` less ``keys`` (a binding left with none is dropped)."""
    out = []
    for b in bindings:
        kept = [k for k in b.key.split(",") if k not in keys]
        if kept:
            out.append(replace(b, key=",".join(kept)))
    return out


class PromptEditor(TextArea, inherit_bindings=False):
    """``submit(text) -> bool``: send ``text`` (True) or say why not (False: it stays here)."""

    DEFAULT_CSS = """
    PromptEditor { height: auto; max-height: 6; min-height: 1; border: none; padding: 0 1; }
    PromptEditor:focus { border: none; }
    """
    # Enter and Ctrl+J for the footer (shown while the editor has focus), then the text area's
    # editing keys less those the app keeps for itself everywhere (F6 step, F7 slower, Ctrl+X
    # abort, Ctrl+C quit, Ctrl+K abort all: they would only stand first in the footer). The keys
    # themselves are handled in _on_key, in order.
    BINDINGS = [
        Binding("enter", "send", "Send"),
        Binding("ctrl+j", "newline", "New line", key_display="^j"),
        *_without(TextArea.BINDINGS, APP_KEYS),
    ]

    value: reactive[str] = reactive("", init=False, layout=True)
    """The text, kept equal to the editor's after every key and paste (setting it replaces it)."""

    def __init__(self, submit: Callable[[str], bool], **kw):
        super().__init__(
            soft_wrap=True,
            tab_behavior="focus",
            show_line_numbers=False,
            highlight_cursor_line=False,
            placeholder=PLACEHOLDER,
            **kw,
        )
        self.submit = submit
        self.sent: list[str] = []
        self._recalled: int | None = None  # the index in self.sent shown, while browsing it

    def on_resize(self, event: events.Resize) -> None:
        """The hint fitted to the new width; toasts lifted above the editor's new height."""
        hint = placeholder(max(1, self.content_size.width))
        if hint != self.placeholder:
            self.placeholder = hint
        self.call_after_refresh(self._lift_toasts)

    @deferred  # after the layout: the editor may be leaving by then
    def _lift_toasts(self) -> None:
        """Toasts stand above the editor and the footer under it, however many lines the editor
        has (Textual's sit on the row above the footer: they covered the hint and the settings)."""
        screen = self.screen
        try:
            rack = screen.get_child_by_type(ToastRack)
        except NoMatches:  # no toast yet on this screen
            return
        rows = max(1, screen.size.height - self.region.y)
        if rack.styles.margin.bottom != rows:
            rack.styles.margin = (0, 0, rows, 0)

    # -- the text --------------------------------------------------------------------------------
    def watch_value(self, value: str) -> None:
        if value != self.text:  # set from outside (a refused prompt brought back, a test)
            self.load_text(value)
            self.move_cursor(self.document.end)

    def _synced(self) -> None:
        self.value = self.text

    def set_text(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)
        self._synced()

    # -- keys, in the order they came ---------------------------------------------------------------
    async def _on_key(self, event: events.Key) -> None:
        key = event.key
        handled = True
        if key in SEND_KEYS:
            self.action_send()
        elif key in NEWLINE_KEYS:
            self.action_newline()
        elif key == "up" and self._history(-1):
            pass
        elif key == "down" and self._history(+1):
            pass
        elif bindings := self._bindings.key_to_bindings.get(key):
            await self.run_action(bindings[0].action)  # the text area's own: arrows, backspace, undo...
        else:
            handled = False  # printable text and tab: the text area's own handler
        if handled:
            event.stop()
            event.prevent_default()
            self._restart_blink()
            self._synced()
        else:
            await super()._on_key(event)
            event.prevent_default()  # (done: not again by the class above)
            self._synced()

    async def _on_paste(self, event: events.Paste) -> None:
        """Every line of the paste, as pasted (a terminal's CR line ends become newlines)."""
        event.stop()
        event.prevent_default()
        text = event.text.replace("\r\n", "\n").replace("\r", "\n")
        if result := self._replace_via_keyboard(text, *self.selection):
            self.move_cursor(result.end_location)
        self._synced()

    def action_send(self) -> None:
        text = self.text
        if not self.submit(text):
            return  # refused (said why): kept, to be edited
        if text and (not self.sent or self.sent[-1] != text):
            self.sent.append(text)
            del self.sent[:-HISTORY_SIZE]
        self._recalled = None
        self.set_text("")

    def action_newline(self) -> None:
        self._replace_via_keyboard("\n", *self.selection)

    def _history(self, direction: int) -> bool:
        """↑ in an empty editor (or on the first line of a prompt recalled unchanged): the one
        sent before; ↓ on the last line of a recalled prompt: the next one, then an empty editor.
        Anywhere else the arrows move the cursor."""
        row = self.cursor_location[0]
        browsing = self._recalled is not None and self.text == self.sent[self._recalled]
        if direction < 0:
            if not self.sent or row != 0 or not (browsing or not self.text):
                return False
            i = len(self.sent) - 1 if not browsing else max(0, self._recalled - 1)
        else:
            if not browsing or row != self.document.line_count - 1:
                return False
            i = self._recalled + 1
            if i == len(self.sent):
                self._recalled = None
                self.set_text("")
                return True
        self._recalled = i
        self.set_text(self.sent[i])
        return True
