"""The one thread that owns the engine. The UI talks to it only through commands and snapshots.

The engine is not thread-safe, so exactly this thread calls it. The UI puts commands on a
queue (submit, abort, pause, step once, ...); between steps the runner drains them, steps the
engine, decodes new tokens incrementally and publishes a ``Frame``: an immutable snapshot plus
the text of every request and the event log. The UI reads the newest frame at its own rate, so
UI cost does not grow with the token rate. Nothing here imports textual.

The app runs this loop in a child process by default (``tui.runners.child``: commands and
frames are plain picklable dataclasses for that reason), or in a worker thread of its own.
"""

from __future__ import annotations

import math
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tinyllm.model.tokenizer import Tokenizer
from tinyllm.observe.snapshot import LifecycleEvent
from tinyllm.observe.timeline import Timeline
from tinyllm.request import RequestSettings
from tinyllm.slo import SLO
from tinyllm.stops import StopText
from tinyllm.units import count
from tinyllm.workload import WorkItem
from tui.runners.interface import (
    LOG_LINES,
    Abort,
    AbortAll,
    ClearPrefixCache,
    Frame,
    LoadWorkload,
    LogEntry,
    SetPaused,
    StepOnce,
    Submit,
    lifecycle_log,
)
from tui.runners.loop import CommandLoop
from tui.runners.rate import TokenRate

if TYPE_CHECKING:  # torch loads in the engine's process only
    from tinyllm.engine import ContinuousEngine
    from tui.runners.frames import FrameRecorder


@dataclass
class _Pending:
    due_s: float
    item: WorkItem
    tokens: tuple[int, ...]
    defaults: RequestSettings


class EngineRunner(CommandLoop):
    """The loop that owns one engine (see the module docstring); satisfies interface.Runner."""

    def __init__(
        self,
        engine: ContinuousEngine,
        tokenizer: Tokenizer,
        paused: bool = False,
        step_delay_ms: int = 0,
        on_frame: Callable[[], None] | None = None,
        recorder: FrameRecorder | None = None,
    ):
        super().__init__(paused, step_delay_ms, on_frame)
        self.engine = engine
        self.tok = tokenizer
        engine.hold_clock(paused)
        self.recorder = recorder  # --record: every change goes to the file as it happens
        self._timeline = Timeline()
        self._streams: dict[int, StopText] = {}  # each request's text, its stop strings applied
        self._texts: dict[int, str] = {}
        self._choices: dict[int, tuple[tuple[str, float], ...]] = {}  # logprobs asked: the latest token's
        self._prompts: dict[int, str] = {}
        self._slos: dict[int, SLO] = {}  # a workload line's own SLO, by the requests it made
        self._log: deque[LogEntry] = deque(maxlen=LOG_LINES)
        self._log_seq = 0
        self._pending: list[_Pending] = []
        self._clock = 0.0  # workload clock: runs only while not paused
        self._clock_mark: float | None = None
        self._rate = TokenRate()  # as a replay of this run derives it
        self._step_ms = 0.0
        self._seq = 0
        self.steps_done = 0
        import torch

        self.threads = torch.get_num_threads()
        self._snap = engine.snapshot()  # refreshed by _note_changes after every change
        self._frame: Frame = self._make_frame()

    # -- UI side (any thread) ------------------------------------------------------------------
    @property
    def device(self) -> str:
        return self.engine.device.type

    # -- the loop's parts ------------------------------------------------------------------------
    def _can_run(self) -> bool:
        return not self.paused and (self.engine.has_work() or bool(self._due_now()))

    def _apply(self, cmd) -> None:
        eng = self.engine
        try:
            if isinstance(cmd, Submit):
                self._submit(cmd.prompt, cmd.tokens, cmd.settings)
            elif isinstance(cmd, LoadWorkload):
                self._tick_clock()
                for it, toks in zip(cmd.items, cmd.tokens):
                    self._pending.append(_Pending(self._clock + it.arrival_s, it, toks, cmd.defaults))
                self._pending.sort(key=lambda p: p.due_s)
                self._add_log("info", cmd.loaded())
            elif isinstance(cmd, Abort):
                if eng.abort(cmd.rid):
                    self._note_changes()
                else:
                    self._add_log("info", f"#{cmd.rid} is not running or queued; nothing to abort")
            elif isinstance(cmd, AbortAll):
                n = len(self._pending)
                self._pending.clear()
                for v in eng.snapshot().requests:
                    if v.state in ("queued", "running", "preempted"):
                        eng.abort(v.rid)
                self._note_changes()
                if n:
                    self._add_log("abort", f"dropped {n} workload requests that had not arrived")
            elif isinstance(cmd, SetPaused):
                self._tick_clock()
                self._set_paused(cmd.after(self.paused))
                self._clock_mark = None
                self._add_log("info", "paused" if self.paused else "resumed")
            elif isinstance(cmd, StepOnce):
                if self.paused:
                    self._clock += 0.05  # the workload clock moves one tick
                    if not eng.has_work() and self._pending and self._pending[0].due_s > self._clock:
                        ahead = self._pending[0].due_s - self._clock  # nothing to run till the next
                        self._clock = self._pending[0].due_s  # arrival: go to it (one press
                        self._add_log(
                            "info",
                            f"step: nothing ran; the workload's next arrival "  # a step)
                            f"was {ahead:.2f} s ahead: it arrives now",
                        )
                    self._release_arrivals()
                    if eng.has_work():
                        eng.hold_clock(False)  # the step's own time counts
                        self._step()
                        eng.hold_clock(True)
                    elif not self._log or not self._log[-1].text.startswith("step: nothing to do"):  # said once
                        self._add_log(
                            "info", "step: nothing to do (no queued or running requests, no arrivals to come)"
                        )
            elif isinstance(cmd, ClearPrefixCache):
                if not eng.prefix_cache:
                    self._add_log(
                        "info", "prefix caching is off (--no-prefix-cache, or no chunked prefill): nothing to clear"
                    )
                else:
                    n = eng.clear_prefix_cache()
                    self._add_log("info", f"prefix cache cleared: {n} cached free blocks are plain free blocks now")
                    self._note_changes()
        except Exception as e:  # never let the UI's request kill the loop
            self._error(f"{type(cmd).__name__} failed: {e}")

    def _submit(self, prompt: str, tokens, settings: RequestSettings, slo: SLO | None = None) -> list[int]:
        """Add a request (n > 1: its samples; ``slo``: its workload line's own); their ids ([]
        when the engine refused it)."""
        ids = list(tokens) if tokens is not None else self.tok.encode(prompt)
        try:
            req = settings.request(ids, self.tok.eos_id)
            rids = self.engine.add_forks(req, settings.n) if settings.n > 1 else [self.engine.add_request(req)]
        except ValueError as e:
            self._error(f"request refused: {e}")
            return []
        for rid in rids:
            self._prompts[rid] = prompt
            self._texts[rid] = ""
            if slo is not None:
                self._slos[rid] = slo
            self._streams[rid] = StopText(self.tok.stream(skip_special_tokens=True), settings.stop, settings.min_tokens)
        rid = rids[0]
        samples = f", {len(rids)} samples #{rids[0]}..#{rids[-1]}" if len(rids) > 1 else ""
        self._add_log(
            "submit",
            f"#{rid} queued ({count(len(ids), 'prompt token')}, max {settings.max_new_tokens} new, "
            f"{settings.sampling.describe()}{samples})",
            rid,
        )
        self._note_changes()
        return rids

    def _due_now(self) -> list[_Pending]:
        now = self._tick_clock()
        return [p for p in self._pending if p.due_s <= now]

    def _release_arrivals(self) -> bool:
        due = self._due_now()
        for p in due:
            self._pending.remove(p)
            it = p.item
            self._submit(it.prompt, p.tokens, it.settings(p.defaults), it.slo)
        return bool(due)

    def _tick_clock(self) -> float:
        """Advance the workload clock by real time while running; frozen while paused."""
        now = time.perf_counter()
        if not self.paused and self._clock_mark is not None:
            self._clock += now - self._clock_mark
        self._clock_mark = now
        return self._clock

    def _step(self) -> None:
        t = time.perf_counter()
        try:
            events = self.engine.step()
        except Exception as e:
            self._error(f"engine step failed: {type(e).__name__}: {e}")
            self.last_traceback = traceback.format_exc()
            self._set_paused(True)  # stop looping on a broken state
            self._add_log("error", "engine paused after an error; press space to retry")
            self._note_changes()  # show whatever state the failed step left
            return
        self._step_ms = (time.perf_counter() - t) * 1000
        self.steps_done += 1
        for ev in events:
            stream = self._streams.get(ev.rid)
            if stream is not None:
                self._texts[ev.rid] += stream.step(ev.token)
                if ev.logprob is not None:
                    self._choices[ev.rid] = self._alternatives(ev.logprob)
                if ev.done:
                    self._texts[ev.rid] += stream.flush()
                elif stream.stopped:  # a stop string: it ends here, in this step
                    self.engine.finish(ev.rid, stream.tokens)
        self._note_changes()

    def _alternatives(self, lp) -> tuple[tuple[str, float], ...]:
        """A TokenLogprob as the pane shows it: (text, probability), the chosen token first."""
        text = self.tok.token_text
        return ((text(lp.token), math.exp(lp.logprob)), *((text(t), math.exp(v)) for t, v in lp.top if t != lp.token))

    def _note_changes(self) -> None:
        """Take a fresh snapshot for the next frame and log what the engine says happened."""
        self._snap = self.engine.snapshot()
        self._rate.update(self._snap)
        events = self.engine.pop_lifecycle()
        self._timeline.feed(events)
        self._timeline.note_drafts(self._snap)
        for ev in events:
            self._log_lifecycle(ev)
        self._record(events)

    def _record(self, events: list[LifecycleEvent] = ()) -> None:
        if self.recorder is None:
            return
        x = {
            "paused": self.paused,
            "delay": self.step_delay_ms,
            "pending": len(self._pending),
            "step_ms": round(self._step_ms, 1),  # compute only (no delay, no pause)
            "steps_behind": self.engine.steps - self.steps_done,
        }  # steps made before this runner
        try:
            self.recorder.record(
                self.engine.steps, self._snap, events, self._prompts, self._texts, self._log, x, self._slos
            )
        except (OSError, ValueError) as e:  # disk full, file gone: the run goes on unrecorded
            path, self.recorder = self.recorder.path, None
            self._error(f"recording to {path} stopped: {e}")

    def _log_lifecycle(self, ev: LifecycleEvent) -> None:
        said = lifecycle_log(ev)
        if said is not None:
            self._add_log(*said, ev.rid, ev.slot, ev.step)

    def _add_log(
        self, kind: str, text: str, rid: int | None = None, slot: int | None = None, step: int | None = None
    ) -> None:
        self._log_seq += 1
        step = self.engine.steps if step is None else step
        self._log.append(
            LogEntry(seq=self._log_seq, step=step, time_s=self.engine.now(), kind=kind, text=text, rid=rid, slot=slot)
        )

    def _error(self, msg: str) -> None:
        """Errors go to the log; the UI notifies for each new 'error' entry it sees."""
        self._add_log("error", msg)

    def _make_frame(self) -> Frame:
        self._seq += 1
        return Frame(
            seq=self._seq,
            snapshot=self._snap,
            prompts=dict(self._prompts),
            texts=dict(self._texts),
            log=tuple(self._log),
            paused=self.paused,
            step_delay_ms=self.step_delay_ms,
            pending_arrivals=len(self._pending),
            tokens_per_s=self._rate.tps,
            tps_history=tuple(self._rate.history),
            step_ms=self._step_ms,
            steps_done=self.steps_done,
            tracks=self._timeline.tracks(),
            choices=dict(self._choices),
            slos=dict(self._slos),
        )

    def _set_paused(self, paused: bool) -> None:
        self.paused = paused
        self.engine.hold_clock(paused)  # paused time counts in no latency

    def _before_step(self) -> bool:
        return self._release_arrivals()

    def _published(self) -> None:
        self._record()  # log lines and pause changes made since
        if self.recorder is not None and not self._can_run():
            self.recorder.flush()  # idle or paused: the file is whole on disk

    def _closed(self) -> None:
        if self.recorder is not None:
            self.recorder.close()

    def _log_error(self, text: str) -> None:
        self._error(text)
