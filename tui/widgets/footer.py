"""The footer: Textual's, showing only whole keys.

Textual's footer lays its keys out in one row and cuts the row at the screen's edge, mid-key
(``f5▏`` at 80 columns, ``f8 Fa▏`` at 120). This one keeps the keys that fit, most useful first
(``RANKS``: the focused widget's own keys, help, quit, then the rest), and drops the others
whole; F1 lists every key. It lays itself out again when the screen's width changes.
"""

from __future__ import annotations

from rich.cells import cell_len
from textual import events
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from tui.widgets.deferred import guarded

# action → rank: lower stays longer; an action not named here comes after these, in the order given
RANKS = {
    "send": 0,  # the prompt editor's own keys
    "newline": 1,
    "leave_input": 2,
    "focus_input": 0,  # i: back to the editor
    "back": 0,  # the race: Esc back to the app
    "help": 3,
    "quit": 4,
    "app.quit": 4,
    "settings": 5,
    "load_prompts": 6,
    "toggle_pause": 7,
    "step_once": 8,
    "abort_selected": 9,
    "restart": 9,
    "abort_all": 10,
    "slower": 11,
    "faster": 12,
}


def key_width(key: FooterKey) -> int:
    """The cells a key takes in the footer (not compact): `` key `` then ``description ``."""
    return cell_len(key.key_display) + 2 + (cell_len(key.description) + 1 if key.description else 0)


def fit_keys(keys: list[FooterKey], width: int) -> list[FooterKey]:
    """Of ``keys``, the most useful that fit ``width`` cells whole, in that order: the first that
    does not fit ends the row (a shorter, less useful one after it would stand in its place: Step
    shown without Pause)."""
    order = {id(k): i for i, k in enumerate(keys)}
    ranked = sorted(keys, key=lambda k: (RANKS.get(k.action, len(RANKS)), order[id(k)]))
    kept, used = [], 0
    for k in ranked:
        used += key_width(k)
        if used > width:
            break
        kept.append(k)
    return kept


class FittedFooter(Footer):
    """A footer that never ends mid-key: the keys that fit, most useful first."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self._fitted_width = 0

    def compose(self):  # (the app's bindings have no groups: every key is a FooterKey)
        width = self.app.size.width
        self._fitted_width = width
        widgets = list(super().compose())
        palette = [w for w in widgets if isinstance(w, FooterKey) and w.has_class("-command-palette")]
        keys = [w for w in widgets if isinstance(w, FooterKey) and w not in palette]
        room = width - sum(key_width(p) for p in palette)  # (its bar takes the place of its left padding)
        yield from fit_keys(keys, room)
        yield from palette

    def on_resize(self, event: events.Resize) -> None:
        if self.app.size.width != self._fitted_width and self.is_attached:
            self.call_after_refresh(guarded(self, self.recompose))  # (nothing if it has gone by then)
