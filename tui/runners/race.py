"""The loop that owns a race, as EngineRunner owns an engine: commands in, frames out.

The same commands as the app's runner (pause, step once, step delay, publish interval) plus
``Restart``. The loop steps the race one forward pass at a time (``Race.step``: the lane that is
furthest behind on its own clock) and publishes a ``RaceFrame``. No torch here: the race comes
from a factory (built in the engine process by ``tui.runners.child``, or in the app's process for
tests and ``--engine-thread``), so the app can import this module for its types.
"""

from __future__ import annotations

import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from tinyllm.config import EngineConfig
from tinyllm.race.rules import DEFAULT_BATCH_TIMEOUT_S, DEFAULT_MAX_LEN
from tinyllm.race.spec import LaneSpec
from tinyllm.race.views import LANES, LaneView, lane_detail, lane_title, mib, waiting_lane
from tinyllm.units import duration
from tinyllm.workload import NEW_TOKENS
from tui.runners.interface import LogEntry, SetPaused, StepOnce
from tui.runners.loop import CommandLoop

RACE_LOG_LINES = 50  # a few lines per lane: the race screen shows the newest


@dataclass(frozen=True)
class Restart:
    """Run the race again from the start (the same requests, fresh lanes)."""


@dataclass(frozen=True, kw_only=True)
class RaceFrame:
    seq: int
    lanes: tuple[LaneView, ...]
    paused: bool = False
    step_delay_ms: int = 0
    turns: int = 0  # steps made, all lanes together
    last_lane: str | None = None  # the lane that made the latest step
    log: tuple[LogEntry, ...] = ()
    status: str = "ready"  # "loading" until the lanes are built (engine process)
    cold_steps: int = 0  # measured steps taken after a pause (slow motion, by hand): they run slow
    clock: str = ""  # what the lanes' times rest on (clock_name): the finish line names it

    @property
    def done(self) -> bool:
        return bool(self.lanes) and all(lane.finished for lane in self.lanes)

    @property
    def steps_done(self) -> int:
        return self.turns


class RaceRunner(CommandLoop):
    """Owns one race (see the module docstring); the app's Runner interface, for a RaceFrame."""

    WAKE = CommandLoop.WAKE + (Restart,)

    def __init__(
        self,
        make_race: Callable[[], object],
        paused: bool = False,
        step_delay_ms: int = 0,
        device: str = "cpu",
        threads: int = 0,
        on_frame: Callable[[], None] | None = None,
    ):
        super().__init__(paused, step_delay_ms, on_frame)
        self.make_race = make_race
        self.race = make_race()
        self.device, self.threads = device, threads
        self._log: deque[LogEntry] = deque(maxlen=RACE_LOG_LINES)
        self._log_seq = self._seq = 0
        self._finished: set[str] = set()
        self._after_pause = False  # the next step follows a pause (resumed, or a step by hand)
        self._cold = 0
        self._frame = self._make_frame()
        self._add_log("info", clock_line(self.race.lanes[0].clock) if self.race.lanes else "")

    @property
    def steps_done(self) -> int:
        return self.race.turns

    # -- the loop's parts --------------------------------------------------------------------------
    def _can_run(self) -> bool:
        return not self.paused and not self.race.done()

    def _log_error(self, text: str) -> None:
        self._add_log("error", text)

    def _apply(self, cmd) -> None:
        if isinstance(cmd, SetPaused):
            was = self.paused
            self.paused = cmd.after(self.paused)
            self._after_pause |= was and not self.paused
        elif isinstance(cmd, StepOnce):
            if not self.paused:
                return
            if self.race.done():
                self._add_log("info", "the race is over: r runs it again")
            else:
                self._after_pause = True
                self._step()
        elif isinstance(cmd, Restart):
            self.race = self.make_race()
            self._finished.clear()
            self._after_pause, self._cold = False, 0
            self._add_log("info", "the race starts again; " + clock_line(self.race.lanes[0].clock))

    def _step(self) -> None:
        if (self._after_pause or self.step_delay_ms > 0) and self._measured():
            self._cold += 1  # after a pause its caches are cold: its clock reads high
        self._after_pause = False
        try:
            lane = self.race.step()
        except Exception as e:
            self.last_traceback = traceback.format_exc()
            self.paused = True
            self._add_log("error", f"a race step failed: {type(e).__name__}: {e}; race paused")
            return
        if lane is not None and lane.key not in self._finished and not lane.has_work():
            self._finished.add(lane.key)
            place = len(self._finished)
            self._add_log(
                "finish", f"{lane.title} finished {_ordinal(place)}: {duration(lane.clock.elapsed)} of its clock"
            )

    def _measured(self) -> bool:
        """Whether the lanes' clocks time real steps (not a fixed cost per step)."""
        return any(lane.clock.kind == "wall" for lane in self.race.lanes)

    def _add_log(self, kind: str, text: str) -> None:
        self._log_seq += 1
        self._log.append(LogEntry(seq=self._log_seq, step=self.race.turns, time_s=0.0, kind=kind, text=text))

    def _make_frame(self) -> RaceFrame:
        self._seq += 1
        return RaceFrame(
            seq=self._seq,
            lanes=self.race.views(),
            paused=self.paused,
            step_delay_ms=self.step_delay_ms,
            turns=self.race.turns,
            last_lane=self.race.last,
            log=tuple(self._log),
            cold_steps=self._cold,
            clock=clock_name(self.race.lanes[0].clock) if self.race.lanes else "",
        )


def _ordinal(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")


_PROFILES: dict[tuple[int, str | None], object] = {}  # (model, --cost-profile) -> its CostModel


def clock_name(clock) -> str:
    """The clock the lanes ran on, for the finish line: which, and (the cost clock) its profile."""
    if clock.kind == "fixed":
        return f"a fixed {clock.step_cost_s:g} s a step"
    if clock.kind == "wall":
        return "the wall clock: measured, so figures vary with the machine's load"
    return f"the cost clock, {clock.cost.source}"


def clock_line(clock) -> str:
    """What the lanes' times rest on, in one line (the race's log says it at the start)."""
    if clock.kind == "fixed":
        return f"clock: every step costs {clock.step_cost_s:g} s"
    if clock.kind == "wall":
        return "clock: wall (each lane's measured compute: figures vary with the machine's load; --clock cost for the same figures every run)"
    from tinyllm.race.calibrate import describe

    return describe(clock.cost) + ": the same model for every lane, the same figures every run"


RaceItem = tuple[float, tuple[int, ...], int, int, str]  # (arrival_s, prompt ids, max_new_tokens, priority, tenant)


@dataclass(frozen=True)
class RaceSpec:
    """Everything needed to build the race, as plain picklable values."""

    model_dir: str
    workload: tuple[RaceItem, ...]
    name: str = "workload"  # shown in the status line
    config: EngineConfig = EngineConfig.best(max_len=DEFAULT_MAX_LEN)  # the run's settings: build_race's run
    batch_timeout_s: float = DEFAULT_BATCH_TIMEOUT_S
    lanes: tuple[str | LaneSpec, ...] = LANES  # lane kinds, or LaneSpecs with their own settings
    step_cost_s: float | None = None  # a fixed cost per step (tests): deterministic clocks
    clock: str = "cost"  # --clock: "cost" (each step priced from its work) or "wall" (measured)
    cost_profile: str | None = None  # --cost-profile FILE (None: $TINYLLM_COST_PROFILE, else this machine's)
    warm_up: bool = True
    lane_cap: int | None = None  # --max-num-seqs for lanes with a kv_mib= of their own, on a run without one

    @property
    def device(self) -> str | None:
        return self.config.device

    @property
    def threads(self) -> int | None:
        return self.config.threads

    def make_race(self, model):
        """A fresh race on ``model`` (in whichever process owns the model)."""
        from tinyllm.engine import Request
        from tinyllm.race.race import build_race

        work = [
            (t, Request(list(ids), new, priority=prio, tenant=tenant)) for t, ids, new, prio, tenant in self.workload
        ]
        clock = self.step_clock(model)
        return build_race(model, work, self.config, self.lanes, self.batch_timeout_s, clock, self.lane_cap)

    def step_clock(self, model):
        """What times the lanes' steps: the fixed cost, the cost model (fitted once per model and
        machine, cached on disk and in this process), or None for the wall clock."""
        if self.step_cost_s is not None:
            return self.step_cost_s
        if self.clock == "wall":
            return None
        from tinyllm.race.calibrate import cost_profile

        key = (id(model), self.cost_profile)
        if key not in _PROFILES:
            _PROFILES[key] = cost_profile(model, self.cost_profile, say=lambda _text: None)
        return _PROFILES[key]

    def build(self):
        """(model, device) in the engine process: threads, weights, warm-up. CheckpointError or
        ValueError with a message for the user."""
        import torch

        from tinyllm.model.checkpoint import load_checkpoint
        from tinyllm.model.device import resolve_device

        if self.threads:
            torch.set_num_threads(self.threads)
        device = resolve_device(self.device)
        model, _ = load_checkpoint(self.model_dir, device=device)
        self.make_race(model)  # every request checked before the start
        if self.warm_up:
            from tinyllm.bench import warm_up

            warm_up(model, None, device)
        return model, device

    def start_runner(self, paused: bool, step_delay_ms: int):
        """In the child process: the model, warmed up, and the runner; (runner, (device, threads))."""
        import torch

        model, device = self.build()
        runner = RaceRunner(lambda: self.make_race(model), paused, step_delay_ms, device, torch.get_num_threads())
        return runner, (device, torch.get_num_threads())

    @staticmethod
    def encoder() -> Callable[[RaceFrame], RaceFrame]:
        """Race frames are small (a few lanes of a few dozen rows): they travel whole."""
        return lambda frame: frame

    @staticmethod
    def decoder() -> WholeFrames:
        return WholeFrames()

    def loading_frame(self, max_len: int | None = None) -> RaceFrame:
        """What the app shows while the engine process loads: each lane's free rows. No torch.
        (``max_len`` is the spec's own here.) A lane sized by a KV memory budget shows no rows
        yet: what the budget buys depends on the model's bytes per token, known once it is loaded."""
        run = self.config
        budget = run.budget
        arrivals = any(w[0] > 0 for w in self.workload)
        total = sum(w[2] for w in self.workload)
        specs = [s if isinstance(s, LaneSpec) else LaneSpec(s, s) for s in self.lanes]
        plain = all(s.label == s.kind for s in specs) and len({s.kind for s in specs}) == len(specs)
        lanes = []
        for i, s in enumerate(specs):
            budget_mib = s.kv_mib if s.kv_mib is not None else run.kv_memory_mib
            n = 0 if budget_mib is not None else s.slots or run.seqs_cap
            detail = (
                f"{mib(budget_mib)} of KV memory: its rows or blocks are sized once the model is loaded"
                if budget_mib is not None
                else lane_detail(s.kind, n, self.batch_timeout_s, s.budget or budget, arrivals)
            )
            lanes.append(
                waiting_lane(
                    s.kind if plain else f"lane{i}",
                    detail,
                    n,
                    len(self.workload),
                    total,
                    lane_title(s.label, s.kind),
                    s.kind,
                )
            )
        return RaceFrame(seq=0, lanes=tuple(lanes), status="loading")


class WholeFrames:
    """Parent side of the race's pipe: frames arrive whole; a note is one more log line."""

    def merge(self, frame: RaceFrame) -> RaceFrame:
        return frame

    def note(self, f: RaceFrame, kind: str, text: str) -> RaceFrame:
        entry = LogEntry(seq=(f.log[-1].seq if f.log else 0) + 1, step=f.turns, time_s=0.0, kind=kind, text=text)
        return replace(f, seq=f.seq + 1, log=f.log + (entry,), paused=True)  # a new frame: drawn


def race_workload(path, encode, max_len: int, default_new: int = NEW_TOKENS) -> tuple[RaceItem, ...]:
    """A workload file as (arrival_s, token ids, max_new_tokens, priority, tenant): sampling
    settings and end-of-text are left out (the race is greedy and makes every token, as tinyllm
    bench); a line with ``n`` samples is n requests (it was one: its work lost)."""
    from tinyllm.workload import load_workload, samples, tokenize_checked

    items = load_workload(path)
    ids = tokenize_checked(items, path, encode, max_len, default_new)
    return tuple(
        (it.arrival_s, tuple(i), it.max_new_tokens or default_new, it.priority or 0, it.tenant or "")
        for it, i in samples(items, ids)
    )
