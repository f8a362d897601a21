"""The one thread that owns the engine; the asyncio server talks to it only through a queue.

Why a thread of its own: ``ContinuousEngine`` is not thread-safe, and a step is milliseconds of
torch work that must never run inside the asyncio event loop (every connection would stall).
So exactly one thread calls the engine. HTTP handlers put commands on a thread-safe queue
(submit, abort, call); between steps the thread drains them, steps the engine and sends each
request's new tokens back to that request's ``asyncio.Queue`` with ``call_soon_threadsafe``,
one wake-up per event loop per step. With nothing to do it blocks on the queue (no polling).

Per-step hooks (``on_step(engine, token_events, lifecycle_events)``) run in this thread right
after each step, so they may read the engine (e.g. ``engine.snapshot()``) safely. The metrics
are one such hook; a recorder for a snapshot stream can be another.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from tinyllm.observe.snapshot import ENDED_STATES, LifecycleEvent
from tinyllm.request import ContextTooLong, Request
from tinyllm.serve.handle import Accepted, End, Failed, Rejected, RequestHandle, Token, deliver

log = logging.getLogger("tinyllm.serve")
T = TypeVar("T")
KEEP_ENDED = 1000  # ended requests the engine remembers (snapshots, viewers); older ones are forgotten
FORGET_EVERY = 256  # steps between two clean-ups


class StepHook(Protocol):
    """Called in the engine thread after every step, and after commands that changed the
    engine without a step (an abort of the last request, with no tokens). ``token_events`` are that step's
    ``tinyllm.engine.Event`` s; ``lifecycle_events`` what ``engine.pop_lifecycle()`` returned
    (the loop pops them: a hook never calls pop_lifecycle itself). Must not block for long: the
    engine waits for it. An exception is logged and the loop goes on."""

    def __call__(self, engine: Any, token_events: list, lifecycle_events: list[LifecycleEvent]) -> None: ...


class EngineLoopStopped(RuntimeError):
    """The engine loop is not running (not started yet, or stopped)."""


class EngineLoop:
    """Owns a ContinuousEngine in one background thread (see the module docstring).

    ``submit()`` / ``abort()`` / ``call()`` are thread-safe; ``start()`` / ``stop()`` bracket
    the thread. ``on_step`` (and ``add_step_hook``) register StepHooks."""

    def __init__(self, engine: Any, on_step: StepHook | None = None, name: str = "tinyllm-engine"):
        self.engine = engine  # touch it only from the engine thread (or via call())
        self._hooks: list[StepHook] = [] if on_step is None else [on_step]
        self._hook_errors: dict[int, int] = {}
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[int, RequestHandle] = {}  # engine thread only: rid → unfinished handle
        self._stop_strings: dict[int, tuple[tuple[str, ...], int]] = {}  # engine thread: rid → (stops, min_tokens)
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopping = False
        self._steps = 0
        self._lock = threading.Lock()  # start/stop/submit against each other
        self._submitted = 0  # samples submitted whose command the engine thread has not applied yet
        self._engine_waiting = 0  # engine thread: the engine's waiting requests, after its last change

    # -- control (any thread) ----------------------------------------------------------------
    def add_step_hook(self, hook: StepHook) -> None:
        """Register a hook; call before start() (the list is read by the engine thread)."""
        self._hooks.append(hook)

    def start(self) -> None:
        with self._lock:
            if not self.thread.is_alive() and not self._stopping:
                self.thread.start()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and not self._stopping

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread between two steps; unfinished requests end with RequestFailed."""
        with self._lock:
            self._stopping = True
            self._commands.put(("stop",))
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout)

    def submit(self, request: Request) -> RequestHandle:
        """Queue ``request`` for the engine; call from a running event loop. Then await
        ``handle.accepted()`` and ``handle.next_output()``. Raises EngineLoopStopped."""
        return self.submit_samples(request, 1)[0]

    def submit_samples(self, request: Request, n: int, stops: tuple[str, ...] = ()) -> list[RequestHandle]:
        """Queue ``n`` samples of ``request`` (OpenAI's ``n``; the engine's ``add_forks``: the
        prompt computed once), one handle each, accepted or rejected together. ``stops``: the
        stop strings its handler matches (the engine works on tokens), for ``stop_strings``."""
        loop = asyncio.get_running_loop()
        handles = [RequestHandle(request, self, loop, stops=tuple(stops)) for _ in range(n)]
        with self._lock:
            if not self.alive:
                raise EngineLoopStopped("the engine loop is not running")
            self._submitted += n
            self._commands.put(("submit", handles))
        return handles

    def waiting(self) -> int:
        """Requests waiting for a slot: the engine's queue (as of its last change) and the samples
        submitted since. Any thread; what the server's --max-waiting bounds."""
        return self._engine_waiting + self._submitted

    def _count_waiting(self) -> None:  # engine thread
        load = getattr(self.engine, "load", None)
        self._engine_waiting = load()[0] if load is not None else 0

    def abort(self, handle: RequestHandle) -> None:
        """Abort ``handle``'s request (queued or running); its slot and blocks are freed."""
        self._commands.put(("abort", handle))

    def finish(self, handle: RequestHandle, keep: int) -> None:
        """Finish ``handle``'s request with reason "stop", keeping ``keep`` tokens (a stop string
        matched); its slot and blocks are freed, and its handle gets a last output."""
        self._commands.put(("finish", handle, keep))

    def call(self, fn: Callable[[Any], T], timeout: float | None = 30.0) -> T:
        """Run ``fn(engine)`` in the engine thread between two steps and return its result:
        the safe way for another thread to read the engine (snapshots, checks)."""
        if threading.current_thread() is self.thread:
            return fn(self.engine)
        return self.call_future(fn).result(timeout)

    async def call_async(self, fn: Callable[[Any], T]) -> T:
        """``call`` for coroutines: awaits without blocking the event loop."""
        return await asyncio.wrap_future(self.call_future(fn))

    def call_future(self, fn: Callable[[Any], T]) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if not self.alive:
                fut.set_exception(EngineLoopStopped("the engine loop is not running"))
                return fut
            self._commands.put(("call", fn, fut))
        return fut

    def abort_rid(self, rid: int) -> bool:
        """Abort request ``rid`` whoever sent it (an operator's abort). Engine thread only (use
        it inside ``call``); its client, if any, gets what was generated so far and
        finish_reason "abort"."""
        ok = self.engine.abort(rid)
        h = self._live.pop(rid, None)
        if h is not None:  # its client's answer ends with finish_reason "abort" (vLLM's), not an error
            self.engine.results.pop(rid, None)
            self._post([(h, End("abort", h._cached_tokens, h._times.accounting()))])
        return ok

    # -- the engine thread -------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                if not self._iteration():
                    return
            except Exception as e:  # noqa: BLE001 - a bug here must not end serving
                log.exception("engine loop iteration failed")
                try:
                    self._fail_all(f"engine loop error: {type(e).__name__}: {e}")
                except Exception:  # noqa: BLE001
                    log.exception("could not fail the running requests")

    def _iteration(self) -> bool:
        """Apply queued commands (waiting for one when idle), step, deliver, run the hooks.
        False once told to stop."""
        eng = self.engine
        cmds = [self._commands.get()] if not eng.has_work() else []  # idle: sleep here
        while True:
            try:
                cmds.append(self._commands.get_nowait())
            except queue.Empty:
                break
        for c in cmds:
            if c[0] == "stop":
                self._shutdown()
                return False
            self._apply(c)
        stepped = eng.has_work()
        events = self._step() if stepped else []
        lifecycle = eng.pop_lifecycle()
        if stepped or lifecycle:
            self._dispatch(events, lifecycle)
            if stepped:
                self._steps += 1
                if self._steps % FORGET_EVERY == 0 and hasattr(eng, "forget_ended"):
                    eng.forget_ended(KEEP_ENDED)  # a server runs for days: memory stays flat
            self._run_hooks(events, lifecycle)  # (after: viewers see what is remembered)
        self._count_waiting()  # (aborts too change it)
        return True

    def _apply(self, cmd: tuple) -> None:
        eng = self.engine
        if cmd[0] == "submit":
            hs: list[RequestHandle] = cmd[1]
            try:
                self._apply_submit(hs)
            finally:  # now in the engine's queue (or refused): counted there, not here
                self._count_waiting()
                with self._lock:
                    self._submitted -= len(hs)
        elif cmd[0] == "abort":
            h = cmd[1]
            if h.rid is not None and self._live.pop(h.rid, None) is not None:
                eng.abort(h.rid)
                eng.results.pop(h.rid, None)  # its client is gone: nobody reads its Result
        elif cmd[0] == "finish":  # its "finished" event ends the handle (_dispatch)
            h = cmd[1]
            if h.rid is not None and h.rid in self._live:
                h._stopping = eng.finish(h.rid, cmd[2])
        elif cmd[0] == "call":
            fn, fut = cmd[1], cmd[2]
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(eng))
                except BaseException as e:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(e)

    def _apply_submit(self, hs: list[RequestHandle]) -> None:
        eng = self.engine
        try:
            req = hs[0].request
            rids = [eng.add_request(req)] if len(hs) == 1 else eng.add_forks(req, len(hs))
        except ValueError as e:  # ContextTooLong included: a bad request
            self._post([(h, Rejected(str(e), isinstance(e, ContextTooLong))) for h in hs])
            return
        except Exception as e:  # noqa: BLE001 - never let one request kill the loop
            log.exception("add_request failed")
            self._post([(h, Rejected(f"{type(e).__name__}: {e}", False)) for h in hs])
            return
        for h, rid in zip(hs, rids):
            h.rid = rid  # the handler reads rid from Accepted
            self._live[rid] = h
            if h.stops:
                self._stop_strings[rid] = h.stops, req.min_tokens
        self._post([(h, Accepted(rid)) for h, rid in zip(hs, rids)])

    def _step(self) -> list:
        try:
            return self.engine.step()
        except Exception as e:  # noqa: BLE001 - the engine isolates bad requests,
            log.exception("engine step failed")  # so this is a bug: fail what runs, keep serving
            self._fail_all(f"engine step failed: {type(e).__name__}: {e}")
            return []

    def _dispatch(self, events: list, lifecycle: list[LifecycleEvent]) -> None:
        posts: list[tuple[RequestHandle, object]] = []
        for ev in lifecycle:
            h = self._live.get(ev.rid)
            if h is None:
                continue
            h._times.on_event(ev)
            if ev.kind == "admitted":
                h._cached_tokens = h._times.cached_tokens  # the prompt's, at the first admission
            elif ev.kind == "failed":
                del self._live[ev.rid]
                self.engine.results.pop(ev.rid, None)  # (its Result: the handler is told below)
                posts.append((h, Failed(ev.reason or "the engine failed this request")))
            elif ev.kind == "aborted":
                del self._live[ev.rid]
                self.engine.results.pop(ev.rid, None)
            elif ev.kind == "finished" and h._stopping:
                del self._live[ev.rid]
                self.engine.results.pop(ev.rid, None)
                posts.append((h, End("stop", h._cached_tokens, h._times.accounting())))
        for ev in events:
            h = self._live.get(ev.rid)
            if h is None:
                continue
            reason = None
            if ev.done:  # EOS and stop token ids: "stop", as OpenAI
                reason = "length" if ev.reason == "length" else "stop"
                del self._live[ev.rid]
                self.engine.results.pop(ev.rid, None)  # the handler has every token already
            posts.append(
                (h, Token(ev.token, reason, h._cached_tokens, h._times.accounting() if ev.done else None, ev.logprob))
            )
        self._post(posts)

    def _post(self, posts: list[tuple[RequestHandle, object]]) -> None:
        """Deliver messages: one call_soon_threadsafe per event loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = defaultdict(list)
        for h, msg in posts:
            by_loop[h.loop].append((h, msg))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(deliver, items)
            except RuntimeError:  # that event loop is closed: nobody reads
                for h, _ in items:
                    if h.rid is not None and self._live.pop(h.rid, None) is not None:
                        self.engine.abort(h.rid)

    def stop_strings(self, rid: int) -> tuple[tuple[str, ...], int]:
        """Request ``rid``'s stop strings and min_tokens (engine thread, from a step hook: until
        the hooks have seen it end), so a viewer shows the text its client got (tinyllm.stops)."""
        return self._stop_strings.get(rid, ((), 0))

    def _run_hooks(self, events: list, lifecycle: list[LifecycleEvent]) -> None:
        for hook in self._hooks:
            try:
                hook(self.engine, events, lifecycle)
            except Exception:  # noqa: BLE001 - a viewer never stops serving
                n = self._hook_errors[id(hook)] = self._hook_errors.get(id(hook), 0) + 1
                if n == 1:
                    log.exception("step hook %r failed (further failures are counted, not logged)", hook)
        for ev in lifecycle:
            if ev.kind in ENDED_STATES:
                self._stop_strings.pop(ev.rid, None)

    def _fail_all(self, why: str) -> None:
        posts = []
        for rid, h in list(self._live.items()):
            try:
                self.engine.abort(rid)
            except Exception:  # noqa: BLE001 - best effort while failing
                log.exception("abort %d failed", rid)
            posts.append((h, Failed(why)))
        self._live.clear()
        self._post(posts)

    def _shutdown(self) -> None:
        self._fail_all("the server is shutting down")
        lifecycle = self.engine.pop_lifecycle()
        self._run_hooks([], lifecycle)
        while True:  # nobody will run what is still queued
            try:
                c = self._commands.get_nowait()
            except queue.Empty:
                return
            if c[0] == "submit":
                self._post([(h, Failed("the server is shutting down")) for h in c[1]])
            elif c[0] == "call" and c[2].set_running_or_notify_cancel():
                c[2].set_exception(EngineLoopStopped("the engine loop stopped"))
