"""An engine (or the race) in its own process: ONE child-process runner for any spec.

Why a process and not the design's thread worker: in one interpreter the UI thread (Textual's
compositor, input handling) and the engine thread share the GIL. The engine's Python between
torch ops then waits for the UI, and measured in ``python -m tui.bench_app`` the engine kept
only about half of its headless tokens/s, even with the UI drawing cheaply at 10 Hz. In a
child process the engine only competes for CPU time.

A spec is plain picklable values (a checkpoint path, never a pickled model) that knows four
things: its ``loading_frame()`` (what the app shows before the child is up: no torch),
``start_runner()`` (in the child: build the model and the runner loop), and how its frames
travel: ``encoder()`` in the child (``EngineSpec``: deltas of what changed; ``RaceSpec``: whole
frames) and ``decoder()`` in the app (``merge`` them back into whole frames; ``note`` an error).
The child applies the commands the app sends (the same dataclasses as a thread runner) and
sends each published frame, so the app reads ``runner.frame`` exactly as with a thread runner.

Nothing on the app's side of this module imports torch: the app shows its screen at once with
the spec's loading frame while the child imports torch and loads the weights.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection

from tinyllm.model.config import CheckpointError
from tui.runners.interface import RunnerDefaults, Submit

START_TIMEOUT_S = 600  # loading a big checkpoint on a slow disk can take a while


class EngineStartError(RuntimeError):
    """The child process could not build the engine (bad checkpoint, bad settings, ...)."""


# -- the child process ------------------------------------------------------------------------
def _child_main(spec, paused: bool, step_delay_ms: int, commands: Connection, frames: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C belongs to the app, which stops us
    devnull = os.open(os.devnull, os.O_WRONLY)  # never write over the app's screen (or its web stream)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        runner, ready = spec.start_runner(paused, step_delay_ms)
    except Exception as e:  # noqa: BLE001 - reported to the app, which exits
        kind = type(e).__name__
        frames.send(("error", (kind, str(e) if isinstance(e, ValueError) else f"{kind}: {e}")))
        return
    encode = spec.encoder()

    def send_frame() -> None:  # called by the runner loop as it publishes
        try:
            frames.send(("frame", encode(runner.frame)))
        except (BrokenPipeError, OSError):
            runner.stop()  # the app is gone

    frames.send(("ready", ready))
    send_frame()
    runner.on_frame = send_frame
    run_child_loop(runner, commands)


def run_child_loop(runner, commands: Connection) -> None:
    """A child process's last act: feed the app's commands to ``runner`` (from a thread; None or
    a dead pipe stops it) and run its loop until then."""

    def read_commands() -> None:
        while True:
            try:
                cmd = commands.recv()
            except (EOFError, OSError):
                cmd = None  # the app died: stop
            if cmd is None:
                runner.stop()
                return
            runner.send(cmd)

    threading.Thread(target=read_commands, name="commands", daemon=True).start()
    runner.run()


# -- the app's side ---------------------------------------------------------------------------
class ChildRunner(RunnerDefaults):
    """A thread runner's interface (interface.Runner) for a spec's runner in a child process.

    ``start(wait=False)`` returns at once: ``frame`` is a "loading" frame until the child's first
    frame arrives (commands sent meanwhile are kept and delivered when it is ready), and if the
    child cannot build the engine, ``start_error`` says why (the app then exits with it).
    ``start()`` (wait=True) blocks until the engine is built instead, raising CheckpointError for
    a bad checkpoint and EngineStartError for anything else."""

    mode = "live"  # interface.Runner: a local engine (or the race)

    def __init__(self, spec, paused: bool = False, step_delay_ms: int = 0, max_len: int | None = None):
        self.spec = spec
        self.device = spec.device or "?"  # known once the child has picked it
        self.threads = spec.threads or 0  # torch threads in the child (0: not known yet)
        ctx = mp.get_context("spawn")  # no fork: torch's threads do not survive it
        self._cmd_recv, self._cmd_send = ctx.Pipe(duplex=False)
        self._frame_recv, self._frame_send = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(
            target=_child_main,
            name=f"tinyllm-{type(spec).__name__}",
            daemon=True,
            args=(spec, paused, step_delay_ms, self._cmd_recv, self._frame_send),
        )
        self._merger = spec.decoder()
        self._frame = replace(spec.loading_frame(max_len), paused=paused, step_delay_ms=step_delay_ms)
        self._early: list = []  # commands sent before the engine was ready
        self._lock = threading.Lock()
        self._ready = False
        self._stopping = False
        self._dead = False
        self.start_error: Exception | None = None  # CheckpointError / EngineStartError

    def start(self, wait: bool = True, timeout: float = START_TIMEOUT_S) -> ChildRunner:
        self._proc.start()
        self._cmd_recv.close()  # the child's ends
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
    def early_prompts(self) -> int:
        """Prompts typed before the engine was ready, waiting to be sent (the status line says so)."""
        with self._lock:
            return sum(isinstance(c, Submit) for c in self._early)

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    @property
    def frame(self):
        return self._frame

    @property
    def steps_done(self) -> int:
        return self._frame.steps_done

    def send(self, cmd) -> None:
        with self._lock:  # one writer at a time, early commands first
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
            return "error", (
                "EngineStartError",
                f"the engine process exited while starting (exit code {self._exitcode()})",
            )

    def _handle(self, kind: str, payload) -> None:
        if kind == "frame":
            self._frame = self._merger.merge(payload)
        elif kind == "ready":
            self.device, self.threads = payload
            with self._lock:  # flushed before any newer command
                for cmd in self._early:
                    self._send_now(cmd)
                self._early = []
                self._ready = True
        elif kind == "error":
            error, message = payload
            message = " ".join(str(message).split())  # the user gets it as one line
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
                        self._handle(
                            "error",
                            ("EngineStartError", f"the engine process did not start within {START_TIMEOUT_S} s"),
                        )
                    continue
                self._handle(*self._recv())
            except (EOFError, OSError):
                if self._frame.status == "loading":  # died between "ready" and its first frame
                    self._handle(
                        "error",
                        (
                            "EngineStartError",
                            f"the engine process exited while starting (exit code {self._exitcode()})",
                        ),
                    )
                    return
                break
        else:
            return  # asked to stop, or never started: not news
        if not self._stopping:
            self._dead = True
            self._frame = self._merger.note(
                self._frame,
                "error",
                f"the engine process exited unexpectedly (exit code {self._exitcode()}); restart tinyllm-tui",
            )

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
