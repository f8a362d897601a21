"""What crosses between the app and a runner: commands in, frames out, and the runner interface.

Plain picklable dataclasses (the process runner sends them over a pipe) and no torch, so the
app and its widgets import this module, never a runner, for their types.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from tinyllm.observe.snapshot import FORK_OF, EngineSnapshot, LifecycleEvent
from tinyllm.observe.timeline import Track
from tinyllm.request import RequestSettings
from tinyllm.slo import SLO
from tinyllm.units import count
from tinyllm.workload import WorkItem

if TYPE_CHECKING:
    from tinyllm.observe.kv_events import CacheView
    from tui.runners.vllm_metrics import ServerFigures

MAX_DELAY_MS = 1000
LOG_LINES = 500


# -- commands (UI → runner) -----------------------------------------------------------------
@dataclass(frozen=True)
class Submit:
    prompt: str
    settings: RequestSettings
    tokens: tuple[int, ...] | None = None  # pre-tokenized (workloads); else encoded here


@dataclass(frozen=True)
class LoadWorkload:
    name: str
    items: tuple[WorkItem, ...]
    tokens: tuple[tuple[int, ...], ...]
    defaults: RequestSettings  # for what a line of the file leaves out

    def loaded(self) -> str:
        """The log line: its lines, and the requests they make where a line asks for n samples."""
        lines = count(len(self.items), "request")
        made = sum(it.n or 1 for it in self.items)
        return f"loaded {self.name}: {lines}" + (
            f" ({made} sequences with their samples)" if made != len(self.items) else ""
        )


@dataclass(frozen=True)
class Abort:
    """Abort one request (queued or running): its slot and blocks are freed at once."""

    rid: int


@dataclass(frozen=True)
class AbortAll:
    """Abort every queued or running request; attached to a server, ``ours_only`` spares the
    requests of its other clients."""

    ours_only: bool = False


@dataclass(frozen=True)
class SetPaused:
    """Pause (no engine step until resumed; commands still apply), resume, or (``None``) toggle:
    pause if running, resume if paused, decided by the runner, so two quick presses cancel out."""

    paused: bool | None

    def after(self, paused: bool) -> bool:
        """Whether the runner is paused once this applies, ``paused`` before."""
        return not paused if self.paused is None else self.paused


TOGGLE_PAUSED = SetPaused(None)


@dataclass(frozen=True)
class SetPublishInterval:
    """The UI draws every ``seconds`` at best: publishing more often than that is wasted work."""

    seconds: float


@dataclass(frozen=True)
class StepOnce:
    """While paused: run exactly one engine step (a replay: move one step forward)."""


@dataclass(frozen=True)
class ClearPrefixCache:
    """Forget every cached prefix block (the engine's clear_prefix_cache)."""


@dataclass(frozen=True)
class SetDelay:
    """Sleep ``ms`` (0..MAX_DELAY_MS) after each step, to watch the scheduler at a readable pace."""

    ms: int


# -- replay only (a recording's runner; a live runner says they do not apply) ----------------
@dataclass(frozen=True)
class StepBack:
    """A replay: one recorded step back."""


@dataclass(frozen=True)
class SeekStep:
    """A replay: to the engine as it was at step ``step`` (its last record at or before it)."""

    step: int


@dataclass(frozen=True)
class JumpEvent:
    """To the next (direction +1) or previous (-1) admission / preemption / abort / end of a request."""

    rid: int
    direction: int


# -- what the runner publishes (runner → UI) ---------------------------------------------------
@dataclass(frozen=True)
class LogEntry:
    seq: int
    step: int
    time_s: float
    kind: str  # submit / admit / preempt / finish / abort / error / info
    text: str
    rid: int | None = None
    slot: int | None = None  # the slot the event happened in (admit: taken; others: freed)


def lifecycle_log(ev: LifecycleEvent) -> tuple[str, str] | None:
    """(log kind, text) for an engine lifecycle event, or None for those the log leaves out
    ("queued": a runner logs the submission itself, with the prompt's size and settings; a
    prefill that computed a whole context in one step)."""
    r = f"#{ev.rid}"
    if ev.kind == "admitted":
        again = f" again ({ev.reason})" if ev.reason else ""
        if ev.reason.startswith(FORK_OF):  # n > 1: no prefill, the parent's blocks shared
            again = f" as a {ev.reason}, sharing its prompt's blocks"
        cached = f", {ev.cached} of {ev.tokens} tokens from the prefix cache" if ev.cached else ""
        return "admit", f"{r} admitted to slot {ev.slot}{again}{cached}"
    if ev.kind == "prefill":
        start, end, total = ev.prefill_span()
        if start != 0 or end != total:  # a prompt spread over several steps
            return "prefill", f"{r} prefill chunk {start}..{end} of {total} tokens"
        return None
    if ev.kind == "preempted":
        return "preempt", (
            f"{r} preempted from slot {ev.slot}: {ev.reason}, back to the queue ({ev.tokens} tokens to recompute)"
        )
    if ev.kind == "finished":
        why = {"eos": "end-of-text", "stop": "a stop token or string"}.get(ev.reason, "max tokens")
        return "finish", f"{r} finished: {ev.tokens} tokens ({why})"
    if ev.kind == "aborted":
        return "abort", f"{r} aborted after {ev.tokens} tokens"
    if ev.kind == "failed":
        return "error", f"{r} failed, the others go on: {ev.reason}"
    if ev.kind == "waiting" and ev.reason and not ev.reason.startswith("queue:"):
        return "wait", f"{r} waits: {ev.reason.partition(': ')[2]}"  # queue order changes are the list's
    return None


@dataclass(frozen=True, kw_only=True)
class Frame:
    """Everything the UI shows, immutable. ``seq`` grows with each publish."""

    seq: int
    snapshot: EngineSnapshot
    prompts: dict[int, str] = field(default_factory=dict)  # rid → prompt text
    texts: dict[int, str] = field(default_factory=dict)  # rid → generated text so far (decoded incrementally)
    log: tuple[LogEntry, ...] = ()  # the newest LOG_LINES entries
    paused: bool = False  # (an attached server's runner never pauses it, nor delays or holds arrivals)
    step_delay_ms: int = 0
    pending_arrivals: int = 0  # workload requests not yet arrived
    tokens_per_s: float = 0.0  # recent generation rate (all requests)
    tps_history: tuple[float, ...] = ()  # one point per ~0.25 s, newest last
    step_ms: float | None = None  # duration of the latest engine step (None: not known, a server's stream)
    steps_done: int = 0  # engine steps this runner has made
    status: str = "ready"  # "loading" until the engine is built (process runner)
    tracks: tuple[Track, ...] = ()  # each request's life over steps (the timeline panel)
    server: ServerFigures | None = None  # attached to a vLLM server: its /metrics figures
    kv_cache: CacheView | None = None  # and, with --kv-events, its prefix cache from KV events
    choices: dict[int, tuple[tuple[str, float], ...]] = field(default_factory=dict)
    # ^ rid → its latest token and the top alternatives, (text, probability), the chosen one
    #   first: for the requests that asked for logprobs (settings dialog), else none
    slos: dict[int, SLO] = field(default_factory=dict)  # rid → its workload line's own SLO (wins over --slo)

    @classmethod
    def loading(cls, snapshot: EngineSnapshot) -> Frame:
        """What the app shows before the engine's (or the server's) first frame."""
        return cls(seq=0, snapshot=snapshot, status="loading")


class Runner(Protocol):
    """What the app needs from whatever runs the engine (a thread, a child process, ...). The
    members only some runners give a value come from ``RunnerDefaults``."""

    mode: str  # "live" (a local engine), "replay" (a recording, read-only),
    # "attach" (a tinyllm serve), "metrics" (a vLLM server)
    device: str  # "cpu" / "cuda" ("?" until a process runner's engine is up)
    start_error: Exception | None  # the engine could not be built (the app exits with it)
    threads: int  # torch CPU threads the engine uses (0 until known)
    kind: str  # a server runner: which server ("tinyllm serve", "vLLM")
    kv_events: object | None  # a vLLM runner with --kv-events: its KV-events subscriber
    warning: str | None  # a replay: what its recording lacked
    engine: object | None  # a thread runner: the engine in this process (the race builds on its model)
    spec: object | None  # a process runner: what its engine process was built from

    def take_refused(self) -> list[str]: ...  # attached: prompts the server refused, to edit again

    @property
    def frame(self) -> Frame: ...  # the newest published frame (an atomic reference read)

    def send(self, cmd) -> None: ...  # queue a command; never blocks the UI for long

    def run(self, cancelled: Callable[[], bool] = lambda: False) -> None: ...  # the loop (a worker thread)

    def stop(self) -> None: ...


class RunnerDefaults:
    """The Runner members that only some runners have a value for: the rest inherit these."""

    kind = "server"
    kv_events = None
    warning: str | None = None
    engine = None
    spec = None
    early_prompts = 0  # prompts typed while the engine loads, sent once it is ready (ChildRunner)

    def take_refused(self) -> list[str]:
        return []
