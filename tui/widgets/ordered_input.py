"""A one-line field that takes its keys in the order they came.

Textual's ``Input`` inserts printable keys as it receives them but runs its other keys
(backspace, the arrows, Home / End, Enter) as bindings, once the key has bubbled back up to the
app, behind keys already handed on: typed fast (a paste without brackets, a fast typist, a
terminal replaying its input) ``bad`` + 3 backspaces + ``good`` came out scrambled. Here every
key the field binds is run as it arrives (see tui/widgets/prompt_editor.py, which does the same
for the prompt).
"""

from __future__ import annotations

from textual import events
from textual.widgets import Input

INPUT_KEYS = frozenset(key for b in Input.BINDINGS for key in b.key.split(","))  # (not ScrollView's)


class OrderedInput(Input):
    async def _on_key(self, event: events.Key) -> None:
        bindings = self._bindings.key_to_bindings.get(event.key)
        if bindings and event.key in INPUT_KEYS and not event.is_printable:
            event.stop()
            event.prevent_default()
            await self.run_action(bindings[0].action)
            return
        await super()._on_key(event)
        event.prevent_default()  # (done: not again by the class above)
