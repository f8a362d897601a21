"""The replay's own keys (a recording played back): one step back, go to a step, to the start
or the end, and the selected request's next / previous admission, preemption, abort or end. A
mixin of the app, whose ``check_action`` turns them off for a live engine or a server."""

from __future__ import annotations

from tui.runners.interface import JumpEvent, SeekStep, StepBack
from tui.screens.modals import GotoStep


class ReplayKeys:
    """Needs ``runner`` (a ReplayRunner), ``selected``, ``notify``, ``push_screen``, ``_close_help``."""

    def action_step_back(self) -> None:
        self.runner.send(StepBack())

    def action_replay_start(self) -> None:
        steps = self.runner.steps  # a server's stream saved mid-run starts past 0
        self.runner.send(SeekStep(steps[0] if steps else 0))

    def action_replay_end(self) -> None:
        self.runner.send(SeekStep(self.runner.last_step))

    def action_goto_step(self) -> None:
        self._close_help()

        def done(step: int | None) -> None:
            if step is not None:
                self.runner.send(SeekStep(step))

        self.push_screen(GotoStep(self.runner.frame.snapshot.counters.steps, self.runner.last_step), done)

    def _jump(self, direction: int) -> None:
        rid = self.selected
        if rid is None:
            self.notify("No request selected: highlight one in the Requests list.", severity="warning")
            return
        now = self.runner.frame.snapshot.counters.steps
        ahead = [s for s, _ in self.runner.events_of(rid) if (s > now if direction > 0 else s < now)]
        if not ahead:
            self.notify(
                f"#{rid} has no {'later' if direction > 0 else 'earlier'} admission, preemption or end", timeout=3
            )
            return
        self.runner.send(JumpEvent(rid, direction))

    def action_next_event(self) -> None:
        self._jump(+1)

    def action_prev_event(self) -> None:
        self._jump(-1)
