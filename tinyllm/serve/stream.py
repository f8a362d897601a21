"""``GET /v1/tinyllm/stream``: the engine's state as it changes, for viewers (tinyllm-tui --attach).

The stream is a recording (``tinyllm.observe.recording``) sent live, one JSON object per line: first a
header, then one record per change, each the delta of the snapshot since that viewer's previous
record plus the lifecycle events, generated text and prompts since then. So
``curl -N URL/v1/tinyllm/stream > run.jsonl`` is a file ``tinyllm-tui --replay`` plays back.

How it stays cheap: the engine thread (a step hook) takes one snapshot per step only while
someone watches (and one for a step that queued requests, to decode their prompts), and appends
what happened to each viewer's pending box; each viewer encodes
its own delta in the event loop, at its own pace (a slow viewer gets fewer, larger records,
never a backlog of snapshots). A viewer that joins late gets the whole current state (its
encoder starts from a blank snapshot), every past lifecycle event (for the timeline) and every
text so far. A request's text is the one its client got: cut before the stop string its handler
matched (the same ``tinyllm.stops.StopText``, fed the request's stop strings by the EngineLoop).

``POST /v1/tinyllm/abort`` ``{"rid": N}`` (or ``{"rids": [...]}``, all in the same step) aborts any request (an operator's abort; a client
aborts its own by closing its stream).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from tinyllm.observe.recording import SnapshotEncoder, encode_event, json_line, make_header
from tinyllm.observe.snapshot import ENDED_STATES, EngineSnapshot, LifecycleEvent
from tinyllm.request import is_int
from tinyllm.serve.body import ApiError, brief, read_json
from tinyllm.serve.engine_loop import EngineLoop
from tinyllm.serve.security import MAX_BODY_BYTES, MAX_VIEWERS, read_body
from tinyllm.stops import StopText

HEARTBEAT_S = 5.0  # an idle stream still sends a line this often (proxies, dead peers)
MAX_EVENTS = 100_000  # lifecycle history kept for viewers that join late
PRUNE_EVERY = 256  # hook calls between two clean-ups of forgotten requests' texts
MAX_PENDING = 50_000  # events waiting for one viewer: beyond that it is too slow, and dropped


class _Viewer:
    """One connected viewer: what happened since its last record (filled by the engine thread)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, snap: EngineSnapshot):
        self.loop = loop
        self.wake = asyncio.Event()
        self.snap = snap
        self.events: list[LifecycleEvent] = []
        self.text: dict[int, str] = {}
        self.prompt: dict[int, str] = {}
        self.dropped = False  # too slow: cut off
        self.closing = False  # the server stops: send what is pending, then end
        self.waits: dict[str, int] = {}  # the wait counts last sent


class StateFeed:
    """The step hook that feeds every viewer (see the module docstring)."""

    def __init__(
        self,
        tokenizer: Any,
        model_name: str,
        settings: dict[str, Any],
        stop_strings: Callable[[int], tuple[tuple[str, ...], int]] = lambda rid: ((), 0),
    ):
        self.tok, self.model_name, self.settings = tokenizer, model_name, settings
        self.stop_strings = stop_strings  # rid → (stop strings, min_tokens): its client's text
        self._lock = threading.Lock()
        self._viewers: list[_Viewer] = []
        self._events: deque[LifecycleEvent] = deque(maxlen=MAX_EVENTS)
        self._texts: dict[int, str] = {}
        self._prompts: dict[int, str] = {}
        self._streams: dict[int, Any] = {}
        self._calls = 0

    # -- the engine thread ----------------------------------------------------------------------
    def on_step(self, engine: Any, token_events: list, lifecycle: list[LifecycleEvent]) -> None:
        self._events.extend(lifecycle)
        new_prompts, snap = {}, None
        for ev in lifecycle:
            if ev.kind == "queued":
                snap = snap or engine.snapshot()
                prompt = list(snap.request(ev.rid).prompt)
                new_prompts[ev.rid] = self._prompts[ev.rid] = self.tok.decode(prompt, skip_special_tokens=True)
                self._texts[ev.rid] = ""
                stops, min_tokens = self.stop_strings(ev.rid)  # the text its client gets: cut at a stop
                self._streams[ev.rid] = StopText(self.tok.stream(skip_special_tokens=True), stops, min_tokens)
        text: dict[int, str] = {}

        def add(rid: int, piece: str) -> None:
            if piece:
                text[rid] = text.get(rid, "") + piece
                self._texts[rid] += piece

        for ev in token_events:
            stream = self._streams.get(ev.rid)
            if stream is not None:
                add(ev.rid, stream.step(ev.token))
        for ev in lifecycle:  # after its last token's text
            if ev.kind in ENDED_STATES and (stream := self._streams.pop(ev.rid, None)):
                add(ev.rid, stream.flush())  # the tail held back in case a stop began there
        self._calls += 1
        if self._calls % PRUNE_EVERY == 0:  # texts of requests the engine forgot
            live = {v.rid for v in engine.snapshot().requests}
            for d in (self._texts, self._prompts, self._streams):
                for rid in [r for r in d if r not in live]:
                    del d[rid]
        with self._lock:
            viewers = list(self._viewers)
        if not viewers:
            return
        snap = engine.snapshot() if snap is None or token_events else snap
        for v in viewers:
            with self._lock:
                v.snap = snap
                v.events += lifecycle
                for rid, t in text.items():
                    v.text[rid] = v.text.get(rid, "") + t
                v.prompt.update(new_prompts)
                if len(v.events) > MAX_PENDING:
                    v.dropped = True
            try:
                v.loop.call_soon_threadsafe(v.wake.set)
            except RuntimeError:  # its event loop is gone
                self.unsubscribe(v)

    def subscribe(self, engine: Any, loop: asyncio.AbstractEventLoop) -> tuple[_Viewer, dict]:
        """Run in the engine thread (EngineLoop.call): a viewer with the whole state so far, and
        the header its stream starts with."""
        snap = engine.snapshot()
        v = _Viewer(loop, snap)
        live = {r.rid for r in snap.requests}
        v.events = [e for e in self._events if e.rid in live]
        v.text = {rid: t for rid, t in self._texts.items() if rid in live}
        v.prompt = {rid: p for rid, p in self._prompts.items() if rid in live}
        with self._lock:
            self._viewers.append(v)
        return v, make_header(snap, self.model_name, "server", self.settings)

    def close(self) -> None:
        """End every viewer's stream after its pending record (the server is shutting down: that
        record holds the requests the engine loop's stop ended). Any thread."""
        with self._lock:
            viewers, self._viewers = self._viewers, []
        for v in viewers:
            v.closing = True
            try:
                v.loop.call_soon_threadsafe(v.wake.set)
            except RuntimeError:
                pass

    @property
    def viewer_count(self) -> int:
        with self._lock:
            return len(self._viewers)

    def unsubscribe(self, v: _Viewer) -> None:
        with self._lock:
            if v in self._viewers:
                self._viewers.remove(v)

    # -- the event loop -------------------------------------------------------------------------
    def take(self, v: _Viewer) -> tuple[EngineSnapshot, list[LifecycleEvent], dict[int, str], dict[int, str]]:
        with self._lock:
            out = v.snap, v.events, v.text, v.prompt
            v.events, v.text, v.prompt = [], {}, {}
            v.wake.clear()
        return out


def viewer_record(
    viewer: _Viewer,
    encoder: SnapshotEncoder,
    snap: EngineSnapshot,
    events: list[LifecycleEvent],
    text: dict[int, str],
    prompt: dict[int, str],
) -> dict[str, Any]:
    """One record of a viewer's stream (what ``take`` gave it): the stream's and a server
    recording's (tinyllm/serve/recorder.py) alike."""
    rec: dict[str, Any] = {"step": snap.counters.steps}
    delta = encoder.encode(snap)
    if delta:
        rec["snap"] = delta
        waits = snap.wait_counts()  # why requests wait, counted (WAIT_REASONS)
        if waits != viewer.waits:
            rec["x"] = {"waits": waits}
            viewer.waits = waits
    if events:
        rec["life"] = [encode_event(e) for e in events]
    if prompt:
        rec["prompt"] = prompt
    if text:
        rec["text"] = text
    return rec


def _line(obj: Any) -> bytes:
    return json_line(obj).encode() + b"\n"


async def _records(feed: StateFeed, engine_loop: EngineLoop, request: Request):
    loop = asyncio.get_running_loop()
    viewer, header = await engine_loop.call_async(lambda eng: feed.subscribe(eng, loop))
    encoder = SnapshotEncoder(header)
    try:
        yield _line(header)
        while not viewer.dropped:
            # the last record once the engine thread is gone (its stop ran the hooks: read before take)
            closing = viewer.closing or not engine_loop.thread.is_alive()
            snap, events, text, prompt = feed.take(viewer)
            # (a heartbeat when nothing changed)
            yield _line(viewer_record(viewer, encoder, snap, events, text, prompt))
            if closing:
                return
            try:
                await asyncio.wait_for(viewer.wake.wait(), HEARTBEAT_S)
            except TimeoutError:
                pass
            if await request.is_disconnected():
                return
    finally:
        feed.unsubscribe(viewer)


MAX_ABORT_RIDS = 10_000  # POST /v1/tinyllm/abort {"rids": [...]}: at most this many at once


def add_stream_route(
    app: Any,
    engine_loop: EngineLoop,
    tokenizer: Any = None,
    model_name: str = "model",
    settings: dict[str, Any] | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_viewers: int = MAX_VIEWERS,
) -> StateFeed:
    """Register ``GET /v1/tinyllm/stream`` and ``POST /v1/tinyllm/abort`` on ``app`` (a FastAPI
    app) and the feed's step hook on ``engine_loop`` (before it starts)."""
    feed = StateFeed(tokenizer, model_name, settings or {}, engine_loop.stop_strings)
    engine_loop.add_step_hook(feed.on_step)

    @app.get("/v1/tinyllm/stream")
    async def stream(request: Request) -> StreamingResponse:
        if feed.viewer_count >= max_viewers:  # each costs the engine thread a snapshot per step
            raise ApiError(
                f"{feed.viewer_count} viewers watch this server already, its limit (--max-viewers {max_viewers}); "
                "retry when one leaves",
                None,
                "too_many_viewers",
                429,
                "rate_limit_error",
                {"retry-after": "5"},
            )
        return StreamingResponse(
            _records(feed, engine_loop, request),
            media_type="application/x-ndjson",
            headers={"cache-control": "no-cache"},
        )

    @app.post("/v1/tinyllm/abort")
    async def abort(request: Request) -> JSONResponse:
        body = await read_json(await read_body(request, max_body_bytes))
        if isinstance(body, dict) and "rids" in body:  # several, in one engine call: the same step
            rids = body["rids"]
            if not isinstance(rids, list) or not rids or len(rids) > MAX_ABORT_RIDS or not all(is_int(r) for r in rids):
                raise ApiError(
                    f'"rids" must be a list of 1..{MAX_ABORT_RIDS} request ids (integers), got {brief(rids)}',
                    "rids",
                    "invalid_type",
                )
            done = await engine_loop.call_async(lambda eng: [engine_loop.abort_rid(r) for r in rids])
            return JSONResponse({"rids": rids, "aborted": done})
        rid = body.get("rid") if isinstance(body, dict) else None
        if not is_int(rid):
            raise ApiError(f'"rid" must be a request id (an integer), got {brief(rid)}', "rid", "invalid_type")
        aborted = await engine_loop.call_async(lambda eng: engine_loop.abort_rid(rid))
        return JSONResponse({"rid": rid, "aborted": aborted})

    return feed
