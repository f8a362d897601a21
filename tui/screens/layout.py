"""The app's two layouts: the list view (slots, blocks, the request list or timeline, the
selected request and the event log) and the panes view (every slot's request writing at once,
``tui/widgets/panes.py``). ``p`` or the palette switches; ``--panes`` starts in the panes view.

A mixin of the app: it decides which of the two a frame draws (only the one on screen: the
other is drawn afresh when it comes back), where the keys go in each, and what Enter on a pane
does (the list view, with that request selected).
"""

from __future__ import annotations

from tui.runners.interface import Frame
from tui.widgets.deferred import guarded
from tui.widgets.panes import PaneOpened, PanesView
from tui.widgets.prompt_editor import PromptEditor

PANES_KEYS = (
    ("p", "the panes view (every slot's request writing at once) / the list view"),
    ("←↑↓→ (panes)", "select the pane beside; PgUp / PgDn, Home / End: other pages of panes"),
    ("enter (panes)", "open the selected pane's request in the list view"),
)
PANES_HELP = """
Panes (p): one pane per KV slot, each writing its request's text as it is generated (the prompt
  dimmed, then the text), tiled to fit. A pane's title: the request, its state (the colours above;
  'prefill 40%' while its prompt is computed in chunks), tokens so far / max, TTFT, the slot and
  (paged) its KV blocks. A request that leaves its slot stays in the pane, dimmed (finished,
  aborted) or waiting to be recomputed (preempted), until another request takes the slot: then the
  pane clears for the newcomer. The heavy frame is the selected request (x aborts it). More panes
  than fit: the first line says how many are off screen, PgDn / PgUp page through them."""


class PanesLayout:
    """Needs the app's ``selected``, ``select``, ``_focus``, ``_shown_seq``, ``_placed``,
    ``refresh_from_runner``, and ``start_panes`` (the layout to start in)."""

    @property
    def panes_on(self) -> bool:
        return self.has_class("-panes")

    def panes_mode(self) -> str:
        """What the empty panes view's hint says how to start (a replay, a server, an engine)."""
        return "replay" if self.replay else "server" if self.remote else "live"

    def set_layout(self, panes: bool) -> None:
        """Switch to the panes view (True) or the list view; the keys follow (not out of the
        prompt editor), and the view that comes back is drawn from the newest frame."""
        if panes == self.panes_on:
            return
        self.set_class(panes, "-panes")
        view = self.query_one(PanesView)
        if panes:
            view.show_page_of(self.selected)
        self._placed = ()  # the list's rows and cursor: placed again on its next frame
        if not isinstance(self.focused, PromptEditor):
            self._focus_requests()
        self._shown_seq = -1
        self.call_after_refresh(self.refresh_from_runner, True)

    def action_toggle_panes(self) -> None:
        self.set_layout(not self.panes_on)

    def _draw_panes(self, frame: Frame) -> None:
        self.query_one(PanesView).show(frame, self.selected)

    def on_pane_opened(self, event: PaneOpened) -> None:
        """Enter on a pane: the list view, that request selected (and the list focused)."""
        self.set_layout(False)
        self.select(event.rid)

    def _focus_requests(self) -> None:
        """Focus the panes in the panes view; in the list view, the request list or timeline."""
        if self.panes_on:
            self._focus(self.query_one(PanesView))
        else:
            super()._focus_requests()

    # Keys for the list view's panels: they bring it back first.
    def action_toggle_timeline(self) -> None:
        if self.panes_on:
            self.set_layout(False)
        super().action_toggle_timeline()

    def action_focus_log(self) -> None:
        if self.panes_on:
            self.set_layout(False)
            self.call_after_refresh(guarded(self, super().action_focus_log))  # (once the log is laid out)
            return
        super().action_focus_log()
