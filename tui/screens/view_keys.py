"""The app's keys that change what is on screen, not the run: the timeline and its zoom, the
event log's scrollback, the prompt editor's focus, the help, the race, where a recording goes.
A mixin of the app (``TinyLLMApp``): it reads and moves focus between the app's panels."""

from __future__ import annotations

from tui.runners.interface import Frame
from tui.screens.modals import HOW_TO_READ, PALETTE_KEY, HelpScreen
from tui.widgets.event_log import HISTORY, EventLog
from tui.widgets.prompt_editor import PromptEditor
from tui.widgets.request_list import RequestList
from tui.widgets.timeline import TimelinePanel

EDITOR_KEYS = (  # the help's rows for the prompt editor (tui/widgets/prompt_editor.py)
    ("enter (in the prompt)", "send the prompt: exactly the text in the editor"),
    (
        "ctrl+j (in the prompt)",
        "a new line in the prompt (also shift+enter / alt+enter where the terminal "
        "reports them); a paste keeps every line",
    ),
    ("↑ / ↓ (in the prompt)", "earlier prompts sent, when the editor is empty (as in a shell)"),
    ("letters (in the prompt)", "are text, never commands: esc first, then the keys above"),
)


class ViewKeys:
    """Needs the app's ``selected``, ``replay``, ``recording``, ``_details_frame``, ``runner``,
    ``BINDINGS``, ``_applies`` and Textual's App (``query_one``, ``notify``, ``screen``...);
    ``HELP_EXTRA`` and ``HELP_TEXT``: what the help adds to the keys and how to read the screen."""

    HELP_EXTRA: tuple[tuple[str, str], ...] = ()
    HELP_TEXT = ""

    def _show_timeline(self, frame: Frame) -> None:
        timeline = self.query_one("#timeline", TimelinePanel)
        if timeline.display:
            timeline.show(frame.tracks, frame.snapshot.counters.steps, self.selected)

    def action_race(self) -> None:
        from tui.screens.race import open_race

        self._close_help()
        open_race(self)

    def action_recording(self) -> None:
        """The palette's Record: a run is recorded from the start (--record FILE), so say where
        this one goes, or how to record one."""
        if self.recording is not None:
            self.notify(
                f"This run is being recorded to {self.recording} (every step, as it happens); the file is "
                f"closed when the app quits. Replay it with tinyllm-tui --replay {self.recording}.",
                title="recording",
                timeout=8,
            )
        else:
            self.notify(
                "A run is recorded from its start: quit, then tinyllm-tui --record FILE (every step is "
                "written as it happens); tinyllm-tui --replay FILE plays it back, step by step.",
                title="not recording",
                timeout=8,
            )

    def action_toggle_timeline(self) -> None:
        timeline = self.query_one("#timeline", TimelinePanel)
        requests = self.query_one("#requests", RequestList)
        was = self.focused
        timeline.display, requests.display = not timeline.display, timeline.display
        shown = timeline if timeline.display else requests
        if not isinstance(was, PromptEditor):  # the keys follow the panel (↑/↓ select, ← → scroll)
            self._focus(shown)
        self._show_timeline(self._details_frame or self.runner.frame)

    def _zoom(self, out: bool) -> None:
        timeline = self.query_one("#timeline", TimelinePanel)
        if not timeline.display:
            self.action_toggle_timeline()
        if not (timeline.zoom_out() if out else timeline.zoom_in()):
            self.notify(
                f"the timeline is already at {timeline.per_col} step{'s' if timeline.per_col > 1 else ''} per column",
                timeout=2,
            )

    def action_zoom_out(self) -> None:
        self._zoom(out=True)

    def action_zoom_in(self) -> None:
        self._zoom(out=False)

    def action_focus_log(self) -> None:
        """The event log, to scroll back through (↑ / ↓, PgUp / PgDn, Home / End)."""
        log = self.query_one("#log", EventLog)
        if not log.display:
            self.notify(
                "The event log is hidden at this size: a terminal of 100×34 or more shows it.",
                severity="warning",
                timeout=4,
            )
            return
        self._focus(log)

    def action_focus_input(self) -> None:
        self._focus(self.query_one("#prompt", PromptEditor))

    def action_leave_input(self) -> None:
        if isinstance(self.focused, PromptEditor):
            self._focus_requests()

    def _focus_requests(self) -> None:
        """Focus whichever of the request list and the timeline is on screen (both select)."""
        timeline = self.query_one("#timeline", TimelinePanel)
        self._focus(timeline if timeline.display else self.query_one("#requests", RequestList))

    def _focus(self, widget) -> None:
        """Focus ``widget`` now: the next key (already on its way) goes to it. (Widget.focus()
        moves it only once the keys already queued have been handed on, to the old one.)"""
        widget.screen.set_focus(widget)

    def action_help(self) -> None:
        """F1 opens the help, and closes it again (the app's F1 binding has priority over the
        help screen's own, so the toggle lives here)."""
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
        else:
            self._close_help()
            keys = [b for b in self.BINDINGS if self._applies(b.action)]
            move = ("↑ / ↓ · PgUp / PgDn · Home / End", "select a request (Requests list or timeline)")
            back = (
                (
                    "← / → (timeline)",
                    "earlier / later steps: it stays there while the run goes on; → to the end follows",
                ),
                (
                    "↑ / ↓ · PgUp / PgDn · Home / End (events)",
                    f"scroll the event log (e, Tab or a click: it keeps the last {HISTORY:,} events); End follows",
                ),
            )
            extra = (move, *back, *self.HELP_EXTRA, PALETTE_KEY) + (() if self.replay else EDITOR_KEYS)
            self.push_screen(
                HelpScreen(keys, how_to_read=("How to read the screen", HOW_TO_READ + self.HELP_TEXT), extra=extra)
            )

    def _close_help(self) -> None:
        """A dialog opened from the help screen replaces it instead of stacking on it."""
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
