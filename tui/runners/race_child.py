"""The race in its own process: every lane in ONE child, taking turns, frames back over a pipe.

One process for all the lanes is what makes the race fair: the lanes never run at the same time,
so no lane's step is slowed by another's, and each lane's clock counts only its own steps. The
child is started like the app's engine process (``tui.runners.child``: spawn, a spec of plain
values, stdout/stderr to /dev/null, commands in, frames out) and warms the model up before the
start, as ``tinyllm bench`` does, so no lane pays for the first calls. Frames are small (a few
lanes of at most a few dozen rows), so they travel whole. Nothing on the app's side imports torch.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Callable

from tinyllm.model.config import CheckpointError
from tinyllm.race.rules import DEFAULT_BATCH_TIMEOUT_S, DEFAULT_NEW
from tinyllm.race.views import LANES, lane_detail, waiting_lane
from tinyllm.request import DEFAULT_MAX_BATCHED_TOKENS
from tui.runners.interface import LogEntry
from tui.runners.child import START_TIMEOUT_S, EngineStartError, run_child_loop
from tui.runners.race import RaceFrame, RaceRunner

RaceItem = tuple[float, tuple[int, ...], int]          # (arrival_s, prompt token ids, max_new_tokens)


@dataclass(frozen=True)
class RaceSpec:
    """Everything needed to build the race, as plain picklable values."""
    model_dir: str
    workload: tuple[RaceItem, ...]
    name: str = "workload"               # shown in the status line
    slots: int = 8                       # static batch size = continuous slots
    max_len: int = 512
    block_size: int = 16
    kv_blocks: int | None = None
    max_batched_tokens: int | None = None
    batch_timeout_s: float = DEFAULT_BATCH_TIMEOUT_S
    lanes: tuple[str, ...] = LANES
    device: str | None = None
    threads: int | None = None
    seed: int = 0
    step_cost_s: float | None = None     # a fixed cost per step (tests): deterministic clocks
    warm_up: bool = True

    def make_race(self, model):
        """A fresh race on ``model`` (in whichever process owns the model)."""
        from tinyllm.engine import Request
        from tinyllm.race.race import build_race
        work = [(t, Request(list(ids), new)) for t, ids, new in self.workload]
        return build_race(model, work, self.slots, self.max_len, self.block_size, self.kv_blocks,
                          self.max_batched_tokens, self.batch_timeout_s, self.lanes, self.step_cost_s, self.seed)

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
        self.make_race(model)                              # every request checked before the start
        if self.warm_up:
            from tinyllm.bench import warm_up
            warm_up(model, None, device)
        return model, device

    def loading_frame(self) -> RaceFrame:
        """What the app shows while the engine process loads: each lane's free rows. No torch."""
        budget = self.max_batched_tokens or DEFAULT_MAX_BATCHED_TOKENS
        arrivals = any(t > 0 for t, _, _ in self.workload)
        total = sum(new for _, _, new in self.workload)
        lanes = tuple(waiting_lane(k, lane_detail(k, self.slots, self.batch_timeout_s, budget, arrivals), self.slots,
                                   len(self.workload), total) for k in LANES if k in self.lanes)
        return RaceFrame(0, lanes, False, 0, 0, None, (), status="loading")


def _child_main(spec: RaceSpec, paused: bool, step_delay_ms: int, commands: Connection, frames: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)          # Ctrl+C belongs to the app, which stops us
    devnull = os.open(os.devnull, os.O_WRONLY)            # never write over the app's screen (or its web stream)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        model, device = spec.build()
    except Exception as e:                                # noqa: BLE001 - reported to the app, which exits
        kind = type(e).__name__
        frames.send(("error", (kind, str(e) if isinstance(e, ValueError) else f"{kind}: {e}")))
        return
    import torch

    def send_frame() -> None:
        try:
            frames.send(("frame", runner.frame))
        except (BrokenPipeError, OSError):
            runner.stop()                                 # the app is gone

    runner = RaceRunner(lambda: spec.make_race(model), paused, step_delay_ms, device, torch.get_num_threads())
    frames.send(("ready", (device, torch.get_num_threads())))
    send_frame()
    runner.on_frame = send_frame

    run_child_loop(runner, commands)


class ProcessRaceRunner:
    """RaceRunner's interface for a race in a child process. ``start()`` returns at once; until
    the child's first frame, ``frame`` is the spec's loading frame; if the child cannot build the
    race, ``start_error`` says why (the app then leaves with it, exit code 2)."""

    def __init__(self, spec: RaceSpec, paused: bool = False, step_delay_ms: int = 0):
        self.spec = spec
        self.device = spec.device or "?"
        self.threads = spec.threads or 0
        ctx = mp.get_context("spawn")                     # no fork: torch's threads do not survive it
        self._cmd_recv, self._cmd_send = ctx.Pipe(duplex=False)
        self._frame_recv, self._frame_send = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_child_main, name="tinyllm-race", daemon=True,
                                 args=(spec, paused, step_delay_ms, self._cmd_recv, self._frame_send))
        self._frame = replace(spec.loading_frame(), paused=paused, step_delay_ms=step_delay_ms)
        self._early: list = []
        self._lock = threading.Lock()
        self._ready = self._stopping = self._dead = False
        self.start_error: Exception | None = None

    def start(self) -> ProcessRaceRunner:
        self._proc.start()
        self._cmd_recv.close()
        self._frame_send.close()
        return self

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    @property
    def frame(self) -> RaceFrame:
        return self._frame

    @property
    def steps_done(self) -> int:
        return self._frame.turns

    def send(self, cmd) -> None:
        with self._lock:
            if not self._ready and cmd is not None:
                self._early.append(cmd)
            else:
                self._send_now(cmd)

    def _send_now(self, cmd) -> None:
        if self._dead:
            return
        try:
            self._cmd_send.send(cmd)
        except (BrokenPipeError, OSError):
            self._dead = True

    def _handle(self, kind: str, payload) -> None:
        if kind == "frame":
            self._frame = payload
        elif kind == "ready":
            self.device, self.threads = payload
            with self._lock:
                for cmd in self._early:
                    self._send_now(cmd)
                self._early, self._ready = [], True
        elif kind == "error":
            error, message = payload
            message = " ".join(str(message).split())
            self.start_error = CheckpointError(message) if error == "CheckpointError" else EngineStartError(message)
            self._dead = True

    def run(self, cancelled: Callable[[], bool] = lambda: False) -> None:
        """Receive frames until the child stops (the app runs this in a worker thread)."""
        began = time.monotonic()
        while not (self._stopping or cancelled() or self.start_error is not None):
            try:
                if not self._frame_recv.poll(0.1):
                    if self._frame.status == "loading" and time.monotonic() - began > START_TIMEOUT_S:
                        self._handle("error", ("EngineStartError", f"the race process did not start within "
                                                                   f"{START_TIMEOUT_S} s"))
                    continue
                self._handle(*self._frame_recv.recv())
            except (EOFError, OSError):
                if not self._stopping and self.start_error is None:
                    if self._frame.status == "loading":
                        self._handle("error", ("EngineStartError", f"the race process exited while starting "
                                                                   f"(exit code {self._exitcode()})"))
                    else:
                        self._dead = True
                        note = LogEntry(len(self._frame.log) + 10**6, self._frame.turns, 0.0, "error",
                                        f"the race process exited unexpectedly (exit code {self._exitcode()})")
                        self._frame = replace(self._frame, log=self._frame.log + (note,), paused=True)
                return

    def _exitcode(self):
        self._proc.join(1.0)
        return self._proc.exitcode

    def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        with self._lock:
            self._send_now(None)
        if self._proc.pid is not None:
            self._proc.join(3.0)
            if self._proc.is_alive():
                self._proc.terminate()
                self._proc.join(1.0)


def race_workload(path, encode, max_len: int, default_new: int = DEFAULT_NEW) -> tuple[RaceItem, ...]:
    """A workload file as (arrival_s, token ids, max_new_tokens): sampling settings and
    end-of-text are left out (the race is greedy and makes every token, as tinyllm bench)."""
    from tinyllm.workload import load_workload, tokenize_checked
    items = load_workload(path)
    ids = tokenize_checked(items, path, encode, max_len, default_new)
    return tuple((it.arrival_s, tuple(i), it.max_new_tokens or default_new) for it, i in zip(items, ids))
