"""What the app reads from a frame's event log: the slots that changed in the latest step (the
slot grid's flags), the log's new entries (appended, or the log shown afresh when the frame's is
another history), and a toast for each new error. A mixin of the app (``TinyLLMApp``)."""

from __future__ import annotations

from tui.runners.interface import Frame, LogEntry
from tui.widgets.event_log import EventLog


class LogFeed:
    """Needs the app's ``replay``, ``remote``, ``ACTIVE``, ``_flags``, ``_idle_at_step``,
    ``_last_log``, ``notify`` and ``query_one``."""

    def _update_flags(self, frame: Frame) -> None:
        """Slots that changed in the latest step, from the event log (admit / finish / preempt / abort).
        A live engine gone idle (nothing queued, running or to arrive, not paused) has none: its
        slots are free ('#9 ✓ done' stayed in a free slot until the next request). Paused, the
        latest step's changes stay: stepping by hand, they are the news. The step an engine went
        idle at, running, has no news after that, whatever comes next at that step (a pause, a
        prompt queued): '#9 ✓ done' came back on screen."""
        snap = frame.snapshot
        steps = snap.counters.steps
        self._flags = {}
        if self._idle_at_step is not None and steps < self._idle_at_step:
            self._idle_at_step = None  # another run: a restarted server counts from 0
        idle = not (frame.pending_arrivals or any(v.state in self.ACTIVE for v in snap.requests))
        if not self.replay:
            if idle and not frame.paused:
                self._idle_at_step = steps
                return
            if self._idle_at_step == steps:
                return
        for e in frame.log[-4 * snap.n_slots :]:
            recent = e.step == snap.counters.steps  # what the latest step did
            if recent and e.slot is not None and e.kind in ("admit", "finish", "preempt", "abort"):
                self._flags[e.slot] = (e.kind, e.rid)

    def _append_log(self, frame: Frame) -> None:
        """Add the frame's new log entries; when the frame's log is not a continuation of what
        is shown (a replay moved, a restarted server has a log of its own), show it afresh."""
        log, last = frame.log, self._last_log
        if not log or last is None or log[-1] == last:
            if not log and last is not None:
                self.query_one("#log", EventLog).reset(())
            elif log and last is None:
                self.query_one("#log", EventLog).add(list(log))
                self._notify_errors(log)
            self._last_log = log[-1] if log else None
            return
        i = len(log) - 1
        while i >= 0 and log[i].seq > last.seq:
            i -= 1
        later = i < 0 and log[0].seq > last.seq and log[0].step >= last.step  # all new: more than a
        # frame holds came between two frames (a restarted server's log starts again at step 0)
        if (i < 0 and not later) or (i >= 0 and log[i] != last) or self.replay:  # not the same history:
            self.query_one("#log", EventLog).reset(log)  # as it is now
        else:  # the log keeps what it showed before (scrolling back: its last HISTORY entries)
            new = list(log[i + 1 :])
            self._notify_errors(new)
            if later and log[0].seq > last.seq + 1:  # said, not silently skipped
                missed = log[0].seq - last.seq - 1
                note = f"… {missed:,} events came between two frames, more than a frame holds: not kept"
                new.insert(
                    0, LogEntry(seq=log[0].seq - 1, step=log[0].step, time_s=log[0].time_s, kind="info", text=note)
                )
            self.query_one("#log", EventLog).add(new)
        self._last_log = log[-1]

    def _notify_errors(self, entries) -> None:
        if not self.replay:  # a replay's errors were seen when they happened
            for e in entries:
                if e.kind == "error":
                    self.notify(e.text, title="server" if self.remote else "engine", severity="error", timeout=8)
