"""The app attached to a server over HTTP: ``tinyllm-tui --attach URL``.

Against ``tinyllm serve`` (``AttachRunner``): the server's ``/v1/tinyllm/stream`` is a live
recording (header, then deltas), so the frames are rebuilt exactly as a replay rebuilds them,
with every panel: slots, blocks, timeline, every request's text, whoever sent it. Prompts typed
here go to ``/v1/completions`` (streaming); aborting one of ours closes its stream (the server
aborts a request whose client went away), aborting another client's request asks
``/v1/tinyllm/abort``. Pause, step and speed belong to the server, not to a viewer.

A server that goes away or answers garbage gives a "disconnected" status that counts down to the
next try, and the app reconnects with backoff; the last state stays on screen meanwhile (a server
that stops cleanly first sends its requests' end, so that state shows none of them running). No
torch here.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import replace

import httpx

from tinyllm.observe.recording import BAD_RECORD, RecordingError, check_header
from tinyllm.observe.snapshot import EngineSnapshot, KVView
from tui.runners.frames import FrameBuilder
from tui.runners.interface import Abort, AbortAll, Frame, LoadWorkload, LogEntry, Submit
from tui.runners.server_link import (
    READ_TIMEOUT_S,
    RETRY_S,
    ServerLink,
    api_error,
    api_key_for,
    completion_body,
    hang_up,
    refused_key,
    send_workload,
    why,
)


class AttachRunner(ServerLink):
    """A ``tinyllm serve`` as the app's runner (messages.Runner); see the module docstring."""

    mode = "attach"  # interface.Runner: a tinyllm serve, every panel
    kind = "tinyllm serve"
    threads = 0
    start_error: Exception | None = None
    device = "remote"

    def __init__(self, url: str, client: httpx.Client | None = None, api_key: str | None = None):
        self.url = url.rstrip("/")
        self.http = client or httpx.Client(timeout=httpx.Timeout(10, read=READ_TIMEOUT_S))
        self.api_key = api_key_for(api_key)
        if self.api_key:  # every request of ours: the stream, completions, aborts
            self.http.headers["authorization"] = f"Bearer {self.api_key}"
        self.paused, self.step_delay_ms, self.steps_done = False, 0, 0
        self.status = "connecting"
        self.model_name = "?"
        self._builder: FrameBuilder | None = None
        self._log: list[LogEntry] = []
        self._lock = threading.Lock()  # _ours / _closed
        self._state = threading.RLock()  # the builder, the log, frames: several threads
        self._stop = threading.Event()
        self._ours: dict[int, httpx.Response] = {}  # our streaming requests, by server request id
        self._closed: set[int] = set()  # ours that we aborted (closed their stream)
        self._seq = 0
        self._stream = None  # (response, line iterator) while connected
        self._frame = self._empty_frame()

    # -- the Runner interface -----------------------------------------------------------------------
    @property
    def frame(self) -> Frame:
        return self._frame

    def send(self, cmd) -> None:
        if isinstance(cmd, Submit):
            threading.Thread(target=self._complete, args=(cmd,), daemon=True, name="completion").start()
        elif isinstance(cmd, Abort):
            threading.Thread(target=self._abort, args=(cmd.rid,), daemon=True).start()
        elif isinstance(cmd, AbortAll):
            active = [v.rid for v in self._frame.snapshot.requests if v.state in ("queued", "running", "preempted")]
            if cmd.ours_only:
                mine = self.ours()
                active = [rid for rid in active if rid in mine]
            threading.Thread(target=self._abort_all, args=(active,), daemon=True).start()
        elif isinstance(cmd, LoadWorkload):
            self._note("info", f"{cmd.loaded()}, sent at their arrival times")
            threading.Thread(
                target=send_workload, args=(cmd, self.send, self._stop), daemon=True, name="workload"
            ).start()
        # pause, step, speed, cache: the server's own business (the app has those keys off)

    def ours(self) -> frozenset[int]:
        """The server's ids of this app's requests still streaming (the others are other clients')."""
        with self._lock:
            return frozenset(self._ours)

    def stop(self) -> None:
        """Stop following: our requests' streams and the server's stream are closed from here, so
        the reading thread wakes now instead of at the server's next heartbeat (up to 5 s)."""
        self._stop.set()
        with self._lock:
            streams = list(self._ours.values())
        for r in streams:
            r.close()
        self._close_stream()

    def start(self) -> AttachRunner:
        """Connect and read the server's state once, so the app starts with the right grid.
        Raises ConnectionError with a one-line reason (no server there, not a tinyllm server)."""
        try:
            self._stream = self._open()
        except (httpx.HTTPError, RecordingError, StopIteration, *BAD_RECORD) as e:
            raise ConnectionError(f"{self.url}: {why(e)}") from None
        return self

    def run(self, cancelled: Callable[[], bool] = lambda: False) -> None:
        """Follow the server's stream; reconnect with backoff when it breaks."""
        tries = 0
        while not (self._stop.is_set() or cancelled()):
            try:
                if self._stream is None:
                    if self.status == "disconnected":
                        self._publish("retrying…")  # (a connect may take its whole timeout)
                    self._stream = self._open()
                    tries = 0
                    if self._stop.is_set():  # stop() came while connecting
                        break
                self._follow(cancelled)
            except Exception as e:  # noqa: BLE001 - a viewer never dies from a server
                self._close_stream()
                if self._stop.is_set():  # stop() closed the stream under us
                    break
                wait = RETRY_S[min(tries, len(RETRY_S) - 1)]
                tries += 1
                self._disconnected(why(e))
                self._count_down(wait)
        self._close_stream()

    # -- the stream ---------------------------------------------------------------------------------
    def _open(self):
        """GET the stream, read its header and first record: (response, line iterator)."""
        r = self.http.send(self.http.build_request("GET", f"{self.url}/v1/tinyllm/stream"), stream=True)
        try:
            if r.status_code == 401:
                r.read()
                raise ValueError(refused_key(self.api_key))
            if r.status_code in (403, 429):  # a tinyllm serve saying why (the operator's key, too many viewers)
                r.read()
                raise ValueError(f"the server refused its stream ({r.status_code}): {api_error(r)}")
            if r.status_code != 200:
                r.read()
                raise ValueError(f"GET /v1/tinyllm/stream answered {r.status_code}: not a tinyllm serve")
            lines = r.iter_lines()
            header = json.loads(next(lines))
            check_header(header, "the server's stream")
            with self._state:  # the server's log of its past, afresh
                self._builder = FrameBuilder(header, log_events=True)
                self.model_name = str(header.get("model", "?"))
                self._apply_line(next(lines))
        except BaseException:
            r.close()
            raise
        reconnected, self.status = self.status == "disconnected", "ready"
        if reconnected:
            self._note("info", f"reconnected to {self.url} (a fresh state: the engine's own log follows)")
        self._publish()
        return r, lines

    def _apply_line(self, line: str) -> None:
        rec = json.loads(line)
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
            raise ValueError(f"the server sent a line that is not a record: {line[:60]!r}")
        with self._state:
            self._builder.apply(rec)

    def _follow(self, cancelled: Callable[[], bool]) -> None:
        """Apply and publish each record: the server already merges a slow viewer's records, so
        each one is worth showing (holding one back would show a finish late)."""
        _, lines = self._stream
        for line in lines:
            if self._stop.is_set() or cancelled():
                return
            if line:
                self._apply_line(line)
                self._publish()
        raise ValueError("the server ended the stream")

    def _close_stream(self) -> None:
        with self._lock:  # stop() may close it from another thread
            stream, self._stream = self._stream, None
        if stream is not None:
            hang_up(stream[0])  # wakes a thread blocked reading it

    # -- frames -------------------------------------------------------------------------------------
    def _empty_frame(self) -> Frame:
        return Frame.loading(EngineSnapshot.empty(KVView.empty("slots")))

    def _publish(self, detail: str = "") -> None:
        with self._state:
            self._seq += 1
            b = self._builder
            if b is None:
                f = replace(self._empty_frame(), seq=self._seq, log=tuple(self._log))
            else:
                f = b.frame(self._seq, False, 0)
            self.steps_done = f.steps_done
            self._frame = replace(f, status=self.status if not detail else f"{self.status}: {detail}")

    def _note(self, kind: str, text: str) -> None:
        """The app's own news (a refused prompt, a lost connection), in the event log."""
        with self._state:
            b = self._builder
            log = b.log if b is not None else self._log
            seq = log[-1].seq + 1 if log else 1
            snap = b.snapshot if b is not None else self._frame.snapshot
            log.append(LogEntry(seq=seq, step=snap.counters.steps, time_s=snap.time_s, kind=kind, text=text))
            self._publish()

    # -- requests -----------------------------------------------------------------------------------
    def _complete(self, cmd: Submit) -> None:
        """Stream one completion (its text reaches the panes through the state stream)."""
        rid = None
        try:
            with self.http.stream("POST", f"{self.url}/v1/completions", json=completion_body(cmd)) as r:
                if r.status_code != 200:
                    r.read()
                    if r.status_code == 400:
                        self._refused(cmd)
                    self._note("error", f"request refused: {api_error(r)}")
                    return
                rid = int(r.headers.get("x-tinyllm-request-id", -1))
                with self._lock:
                    self._ours[rid] = r
                try:
                    for line in r.iter_lines():
                        if line.startswith("data:") and '"error"' in line[:40]:
                            self._note("info", f"#{rid}: {json.loads(line[5:])['error']['message']}")
                        if line == "data: [DONE]" or self._stop.is_set():
                            break
                finally:
                    with self._lock:
                        self._ours.pop(rid, None)
        except (httpx.HTTPError, httpx.StreamError, ValueError, RuntimeError) as e:
            with self._lock:
                aborted_here = rid in self._closed  # _abort closed it under us
            if not (self._stop.is_set() or aborted_here):
                self._note("error", self._failed(cmd, rid, e))

    def _abort(self, rid: int) -> None:
        with self._lock:
            mine = self._ours.pop(rid, None)
            if mine is not None:
                self._closed.add(rid)
        if mine is not None:
            hang_up(mine)  # the server aborts a request whose client left,
        try:  # but a queued one is only noticed at its first
            # token: ask the server outright too
            r = self._post_abort(rid)
            if r.status_code != 200:
                self._note("error", f"abort #{rid} refused: {api_error(r)}")
            elif not r.json().get("aborted") and mine is None:
                self._note("info", f"#{rid} is not running or queued; nothing to abort")
        except (httpx.HTTPError, ValueError) as e:
            self._note("error", f"abort #{rid} failed: {type(e).__name__}: {e}")

    def _abort_all(self, rids: list[int]) -> None:
        """Abort ``rids`` in one call, so the server ends them all in the same step (one call
        each let them run on for tens of steps, one abort a round trip): this app's streams hung
        up first, every rid then asked for at once."""
        if not rids:
            return
        with self._lock:
            ours = [rid for rid in rids if rid in self._ours]
            mine = [self._ours.pop(rid) for rid in ours]
            self._closed.update(ours)
        for r in mine:
            hang_up(r)
        try:
            r = self._post_abort(rids)
            if r.status_code != 200:
                self._note("error", f"abort of {len(rids)} requests refused: {api_error(r)}")
        except (httpx.HTTPError, ValueError) as e:
            self._note("error", f"abort of {len(rids)} requests failed: {type(e).__name__}: {e}")

    def _post_abort(self, rid: int | list[int]) -> httpx.Response:
        """The abort request, sent once more if the pooled connection it went out on had just been
        closed by the server (uvicorn closes a keep-alive connection idle for 5 s; a request that
        crosses the close gets no response: seen on a busy machine). Aborting twice is harmless:
        the second answers aborted=false."""
        url, body = f"{self.url}/v1/tinyllm/abort", ({"rids": rid} if isinstance(rid, list) else {"rid": rid})
        try:
            return self.http.post(url, json=body)
        except httpx.RemoteProtocolError:
            return self.http.post(url, json=body)
