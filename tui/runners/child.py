"""The engine in its own process: the same ``EngineRunner`` loop, talked to over two pipes.

Why a process and not the design's thread worker: in one interpreter the UI thread (Textual's
compositor, input handling) and the engine thread share the GIL. The engine's Python between
torch ops then waits for the UI, and measured in ``python -m tui.bench_app`` the engine kept
only about half of its headless tokens/s, even with the UI drawing cheaply at 10 Hz. In a
child process the engine only competes for CPU time.

The child builds the engine from an ``EngineSpec`` (a checkpoint path, never a pickled model),
applies the commands the app sends (the same dataclasses as the thread runner), and sends each
published ``Frame`` as a delta: only the requests, texts, prompts and log entries that changed
since the previous one. ``ProcessRunner`` merges the deltas back into whole frames, so the app
reads ``runner.frame`` exactly as it does with the thread runner.

Nothing on the app's side of this module imports torch: the app shows its screen at once with a
"loading" frame (built from the spec alone) while the child imports torch and loads the weights.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable

from tinyllm.model.config import CheckpointError, default_kv_blocks
from tinyllm.request import DEFAULT_MAX_BATCHED_TOKENS
from tinyllm.observe.snapshot import Counters, EngineSnapshot, KVView, SlotView
from tui.runners.interface import LOG_LINES, Frame, LogEntry

START_TIMEOUT_S = 600              # loading a big checkpoint on a slow disk can take a while


class EngineStartError(RuntimeError):
    """The engine process could not build the engine (bad checkpoint, bad settings, ...)."""


@dataclass(frozen=True)
class EngineSpec:
    """Everything needed to build the engine, as plain picklable values."""
    model_dir: str
    device: str | None = None          # None: cuda when available, else cpu (decided in the child)
    slots: int = 8
    max_len: int | None = None
    kv: str = "slots"
    block_size: int = 16
    kv_blocks: int | None = None
    seed: int = 0
    threads: int | None = None         # torch CPU threads (None: torch's default)
    chunked_prefill: bool = False      # the token-budget scheduler (kv="paged" only)
    max_batched_tokens: int | None = None
    prefix_cache: bool | None = None   # None: on with chunked prefill
    record: str | None = None          # --record: write the run to this JSONL file as it happens

    def build(self):
        """Load the checkpoint and build the engine: (ContinuousEngine, Tokenizer). Raises
        CheckpointError or ValueError with a message meant for the user."""
        import torch

        from tinyllm.model.checkpoint import load_checkpoint
        from tinyllm.model.device import resolve_device
        from tinyllm.engine import ContinuousEngine
        if self.threads:
            torch.set_num_threads(self.threads)
        device = resolve_device(self.device)
        model, tok = load_checkpoint(self.model_dir, device=device)
        engine = ContinuousEngine(model, self.slots, self.max_len, kv=self.kv, block_size=self.block_size,
                                  kv_blocks=self.kv_blocks, chunked_prefill=self.chunked_prefill,
                                  max_batched_tokens=self.max_batched_tokens, prefix_cache=self.prefix_cache,
                                  generator=torch.Generator(device=device).manual_seed(self.seed))
        return engine, tok

    def open_recorder(self, engine):
        """The --record file's writer (None without --record); OSError if it cannot be written."""
        if not self.record:
            return None
        from tui.runners.frames import FrameRecorder, settings_of
        return FrameRecorder(self.record, engine.snapshot(), Path(self.model_dir).name, self.model_dir,
                             settings_of(self))

    def loading_frame(self, max_len: int) -> Frame:
        """What the app shows while the engine loads: the right grid of free slots (and free
        blocks), no requests, status "loading". Needs no torch and no weights."""
        kv = KVView(self.kv, 0, 0, 0, 0)
        if self.kv == "paged":
            n = self.kv_blocks or default_kv_blocks(self.slots, max_len, self.block_size)
            kv = KVView("paged", n * self.block_size, 0, 0, 0, self.block_size, n, n, (None,) * n)
        else:
            kv = KVView("slots", self.slots * max_len, 0, 0, 0)
        budget = (self.max_batched_tokens or DEFAULT_MAX_BATCHED_TOKENS) if self.chunked_prefill else None
        snap = EngineSnapshot(0.0, self.slots, max_len, tuple(SlotView(s, None, 0, max_len) for s in range(self.slots)),
                              (), (), kv, Counters(), budget)
        return Frame(0, snap, {}, {}, (), False, 0, 0, 0.0, (), status="loading")


# -- deltas: the child sends what changed, the parent rebuilds whole frames -------------------------
class FrameDiffer:
    """Child side: strip a Frame down to what changed since the last one sent."""

    def __init__(self):
        self._views: dict[int, object] = {}
        self._tracks: dict[int, object] = {}
        self._texts: dict[int, str] = {}
        self._prompts: set[int] = set()
        self._log_seq = 0

    def delta(self, f: Frame) -> Frame:
        # The engine reuses a request's view object until the request changes, and the timeline
        # its tracks: identity is enough.
        views = tuple(v for v in f.snapshot.requests if self._views.get(v.rid) is not v)
        self._views.update((v.rid, v) for v in views)
        tracks = tuple(t for t in f.tracks if self._tracks.get(t.rid) is not t)
        self._tracks.update((t.rid, t) for t in tracks)
        texts = {rid: t for rid, t in f.texts.items() if self._texts.get(rid) != t}
        self._texts.update(texts)
        prompts = {rid: p for rid, p in f.prompts.items() if rid not in self._prompts}
        self._prompts.update(prompts)
        log = tuple(e for e in f.log if e.seq > self._log_seq)
        if log:
            self._log_seq = log[-1].seq
        return replace(f, snapshot=replace(f.snapshot, requests=views), texts=texts, prompts=prompts, log=log,
                       tracks=tracks)


class FrameMerger:
    """Parent side: apply deltas, return whole immutable frames."""

    def __init__(self):
        self._views: dict[int, object] = {}           # insertion order = request id order
        self._tracks: dict[int, object] = {}
        self._texts: dict[int, str] = {}
        self._prompts: dict[int, str] = {}
        self._log: deque[LogEntry] = deque(maxlen=LOG_LINES)

    def merge(self, d: Frame) -> Frame:
        self._views.update((v.rid, v) for v in d.snapshot.requests)
        self._tracks.update((t.rid, t) for t in d.tracks)
        self._texts.update(d.texts)
        self._prompts.update(d.prompts)
        self._log.extend(d.log)
        return replace(d, snapshot=replace(d.snapshot, requests=tuple(self._views.values())),
                       texts=dict(self._texts), prompts=dict(self._prompts), log=tuple(self._log),
                       tracks=tuple(self._tracks.values()))

    def note(self, f: Frame, kind: str, text: str) -> Frame:
        """A frame like ``f`` with one more log entry (the parent's own news, e.g. a dead child)."""
        seq = self._log[-1].seq + 1 if self._log else 1
        self._log.append(LogEntry(seq, f.steps_done, f.snapshot.time_s, kind, text))
        return replace(f, log=tuple(self._log), paused=True)


# -- the child process ------------------------------------------------------------------------
def _child_main(spec: EngineSpec, paused: bool, step_delay_ms: int, commands: Connection, frames: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)          # Ctrl+C belongs to the app, which stops us
    devnull = os.open(os.devnull, os.O_WRONLY)            # never write over the app's screen
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        engine, tok = spec.build()
        recorder = spec.open_recorder(engine)
    except Exception as e:                                # noqa: BLE001 - reported to the app, which exits
        kind = type(e).__name__
        frames.send(("error", (kind, str(e) if isinstance(e, ValueError) else f"{kind}: {e}")))
        return
    from tui.runners.engine import EngineRunner                   # the child's side: torch is fine here
    differ = FrameDiffer()

    def send_frame() -> None:                             # called by the runner loop as it publishes
        try:
            frames.send(("frame", differ.delta(runner.frame)))
        except (BrokenPipeError, OSError):
            runner.stop()                                 # the app is gone

    runner = EngineRunner(engine, tok, paused=paused, step_delay_ms=step_delay_ms, recorder=recorder)
    import torch
    frames.send(("ready", (engine.device.type, torch.get_num_threads())))
    send_frame()
    runner.on_frame = send_frame

    run_child_loop(runner, commands)


def run_child_loop(runner, commands: Connection) -> None:
    """A child process's last act: feed the app's commands to ``runner`` (from a thread; None or
    a dead pipe stops it) and run its loop until then. The engine's child and the race's share it."""
    def read_commands() -> None:
        while True:
            try:
                cmd = commands.recv()
            except (EOFError, OSError):
                cmd = None                                # the app died: stop
            if cmd is None:
                runner.stop()
                return
            runner.send(cmd)

    threading.Thread(target=read_commands, name="commands", daemon=True).start()
    runner.run()


# -- the app's side ---------------------------------------------------------------------------
class ProcessRunner:
    """The thread runner's interface (messages.Runner) for an engine in a child process.

    ``start(wait=False)`` returns at once: ``frame`` is a "loading" frame until the child's first
    frame arrives (commands sent meanwhile are kept and delivered when it is ready), and if the
    child cannot build the engine, ``start_error`` says why (the app then exits with it).
    ``start()`` (wait=True) blocks until the engine is built instead, raising CheckpointError for
    a bad checkpoint and EngineStartError for anything else."""

    def __init__(self, spec: EngineSpec, paused: bool = False, step_delay_ms: int = 0, max_len: int | None = None):
        self.spec = spec
        self.device = spec.device or "?"                  # known once the child has picked it
        self.threads = spec.threads or 0                  # torch threads in the child (0: not known yet)
        ctx = mp.get_context("spawn")                     # no fork: torch's threads do not survive it
        self._cmd_recv, self._cmd_send = ctx.Pipe(duplex=False)
        self._frame_recv, self._frame_send = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_child_main, name="tinyllm-engine", daemon=True,
                                 args=(spec, paused, step_delay_ms, self._cmd_recv, self._frame_send))
        self._merger = FrameMerger()
        self._frame: Frame = spec.loading_frame(max_len or spec.max_len or 0)
        self._frame = replace(self._frame, paused=paused, step_delay_ms=step_delay_ms)
        self._early: list = []                            # commands sent before the engine was ready
        self._lock = threading.Lock()
        self._ready = False
        self._stopping = False
        self._dead = False
        self.start_error: Exception | None = None         # CheckpointError / EngineStartError

    def start(self, wait: bool = True, timeout: float = START_TIMEOUT_S) -> ProcessRunner:
        self._proc.start()
        self._cmd_recv.close()                            # the child's ends
        self._frame_send.close()
        if wait:
            try:
                while not self._ready or self._frame.status == "loading":
                    if not self._frame_recv.poll(timeout):
                        raise EngineStartError(f"the engine process did not start within {timeout:.0f} s")
                    self._handle(*self._recv())
                    if self.start_error is not None:
                        raise self.start_error
            except (EngineStartError, CheckpointError):
                self.stop()
                raise
        return self

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def frame(self) -> Frame:
        return self._frame

    def send(self, cmd) -> None:
        with self._lock:                                  # one writer at a time, early commands first
            if not self._ready and cmd is not None:
                self._early.append(cmd)
            else:
                self._send_now(cmd)

    def _send_now(self, cmd) -> None:
        """Write one command (the caller holds ``_lock``: Connection.send is not thread-safe)."""
        if self._dead:
            return
        try:
            self._cmd_send.send(cmd)
        except (BrokenPipeError, OSError):
            self._dead = True

    def _recv(self):
        try:
            return self._frame_recv.recv()
        except (EOFError, OSError):
            if self._ready:
                raise
            return "error", ("EngineStartError", f"the engine process exited while starting "
                                                 f"(exit code {self._exitcode()})")

    def _handle(self, kind: str, payload) -> None:
        if kind == "frame":
            self._frame = self._merger.merge(payload)
        elif kind == "ready":
            self.device, self.threads = payload
            with self._lock:                              # flushed before any newer command
                for cmd in self._early:
                    self._send_now(cmd)
                self._early = []
                self._ready = True
        elif kind == "error":
            error, message = payload
            message = " ".join(str(message).split())      # the user gets it as one line
            self.start_error = CheckpointError(message) if error == "CheckpointError" else EngineStartError(message)
            self._dead = True
            self._frame = replace(self._frame, status="failed")

    def run(self, cancelled: Callable[[], bool] = lambda: False) -> None:
        """Receive frames until the child stops (the app runs this in a worker thread)."""
        began = time.monotonic()
        while not (self._stopping or cancelled() or self.start_error is not None):
            try:
                if not self._frame_recv.poll(0.1):
                    if self._frame.status == "loading" and time.monotonic() - began > START_TIMEOUT_S:
                        self._handle("error", ("EngineStartError", f"the engine process did not start "
                                                                   f"within {START_TIMEOUT_S} s"))
                    continue
                self._handle(*self._recv())
            except (EOFError, OSError):
                if self._frame.status == "loading":     # died between "ready" and its first frame
                    self._handle("error", ("EngineStartError", f"the engine process exited while starting "
                                                               f"(exit code {self._exitcode()})"))
                    return
                break
        else:
            return                                        # asked to stop, or never started: not news
        if not self._stopping:
            self._dead = True
            self._frame = self._merger.note(
                self._frame, "error", f"the engine process exited unexpectedly (exit code {self._exitcode()}); "
                                      "restart tinyllm-tui")

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
