"""Which of the app's keys act where: off in a replay what would change the run, off for a server
what would pace it, replay keys only in a replay, the app's keys off under a dialog or the race;
and each key on the main screen acts as it arrives, in order. A mixin of the app (``TinyLLMApp``),
which has ``replay``, ``remote``, ``tokenizer``, ``BINDINGS`` and Textual's App."""

from __future__ import annotations

from textual import events
from textual.screen import ModalScreen

from tui.screens.modals import HelpScreen
from tui.widgets.panes import PanesView
from tui.widgets.prompt_editor import PromptEditor


class KeyPolicy:
    """The app's check_action and key dispatch, by mode (the sets below name the actions)."""

    READ_ONLY = {
        "abort_selected",
        "abort_all",
        "clear_prefix_cache",
        "load_prompts",
        "settings",
        "focus_input",
        "leave_input",
        "race",
    }
    REPLAY_ONLY = {"step_back", "goto_step", "replay_start", "replay_end", "next_event", "prev_event"}
    SERVER_PACED = {"toggle_pause", "step_once", "slower", "faster", "clear_prefix_cache"}

    def check_action(self, action: str, parameters) -> bool | None:
        """A replay changes nothing (no abort, no prompts, no settings); only a replay moves back
        in time; a server paces itself (no pause, step or speed from a viewer). Keys that do not
        apply are off, and hidden from the footer."""
        if action in ("focus_input", "leave_input"):  # Esc leaves the editor, i goes to it: either is
            editing = isinstance(self.focused, PromptEditor)  # the other's key (text, a dialog's Esc),
            if editing != (action == "leave_input") or len(self.screen_stack) > 1:  # and neither is a dialog's
                return False
        if action in self._own_actions():  # (not Textual's: Tab's focus_next moves in a dialog)
            if any(getattr(screen, "owns_keys", False) for screen in self.screen_stack) and action != "quit":
                return False  # the race (and its help) has keys of its own
            if (
                isinstance(self.screen, ModalScreen)
                and not isinstance(self.screen, HelpScreen)
                and action not in ("quit", "help")
            ):
                return False  # a dialog is open: its keys, not ours
        return self._applies(action)

    async def on_event(self, event) -> None:
        """A key on the main screen, outside the prompt editor, acts as it arrives, in order.
        (Textual hands a key to the focused widget and runs the app's bindings for it once it
        has bubbled back, from wherever the focus is by then: in a burst, Esc t i h i lost its
        t, as i had moved the focus into the editor, where letters are text.)"""
        if (
            isinstance(event, events.Key)
            and not event.is_forwarded
            and len(self.screen_stack) == 1
            and not isinstance(self.focused, PromptEditor)
        ):
            if event.key == "enter" and isinstance(self.focused, PanesView):  # (Enter is the editor's
                self.focused.action_open()  # key elsewhere: a priority binding)
                return
            active = self.screen.active_bindings.get(event.key)
            if active is not None and active.enabled and await self.run_action(active.binding.action, active.node):
                return
        await super().on_event(event)

    @classmethod
    def _own_actions(cls) -> frozenset[str]:
        return frozenset(b.action for b in cls.BINDINGS)

    def _applies(self, action: str) -> bool:
        """Whether ``action`` means anything in this mode (a replay, a server, a local engine):
        the keys check it, and the help lists only what it allows."""
        if action in (self.READ_ONLY if self.replay else self.REPLAY_ONLY):
            return False
        if action == "recording":  # (a palette command: --record records a local engine)
            return not self.remote
        return not (
            self.remote and (action in self.SERVER_PACED or (action == "load_prompts" and self.tokenizer is None))
        )
