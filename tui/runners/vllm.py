"""The app attached to a vLLM server (or any server with vLLM's OpenAI API and metrics).

vLLM shows no scheduler internals to a client, so this runner builds what it can: the server's
figures from ``/metrics`` (polled, see ``tui.runners.vllm_metrics``), and this app's own requests,
streamed from ``/v1/completions`` into the request list and panes with their TTFT and tokens/s
measured here. Aborting one of them closes its stream (vLLM aborts a request whose client goes
away). The slot grid, block map and other clients' requests need engine internals: the app says
so instead of drawing them (``tinyllm serve`` streams them).

Times are this app's clock since it attached; the event log's step column is seconds since then.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import httpx

from tinyllm.observe.snapshot import ENDED_STATES, Counters, EngineSnapshot, KVView, LifecycleEvent, RequestView
from tinyllm.observe.timeline import Timeline
from tinyllm.units import duration
from tui.runners.interface import LOG_LINES, Abort, AbortAll, Frame, LoadWorkload, LogEntry, Submit
from tui.runners.server_link import RETRY_S, ServerLink, api_error, completion_body, hang_up, send_workload, why
from tui.runners.vllm_metrics import MetricsError, MetricsWindow, ServerFigures, parse

if TYPE_CHECKING:  # pyzmq and msgspec load only with --kv-events
    from tui.runners.kv_subscriber import KVEventsSubscriber

POLL_S = 0.5
UNKNOWN_MAX_LEN = 1 << 20  # a server that does not say its context length: let it refuse long prompts


class VllmRunner(ServerLink):
    """messages.Runner over a vLLM server's API and metrics (see the module docstring); it says
    what AttachRunner says when the server goes away (ServerLink)."""

    LOST_STATE = "its text is what arrived before"
    mode = "metrics"  # interface.Runner: a vLLM server, its metrics
    kind = "vLLM"
    device = "remote"
    threads = 0
    start_error: Exception | None = None

    def __init__(
        self,
        url: str,
        client: httpx.Client | None = None,
        poll_s: float = POLL_S,
        kv_events: KVEventsSubscriber | None = None,
    ):
        self.url = url.rstrip("/")
        self.kv_events = kv_events  # --kv-events: the server's prefix cache, from its events
        self.http = client or httpx.Client(timeout=httpx.Timeout(10, read=60))
        self.poll_s = poll_s
        self.paused, self.step_delay_ms, self.steps_done = False, 0, 0
        self.model_name, self.max_len = "?", 0
        self.status = "connecting"
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._window = MetricsWindow()
        self._figures = ServerFigures()
        self._views: dict[int, RequestView] = {}
        self._texts: dict[int, str] = {}
        self._prompts: dict[int, str] = {}
        self._streams: dict[int, httpx.Response] = {}
        self._closed: set[int] = set()
        self._timeline = Timeline()
        self._log: list[LogEntry] = []
        self._seq = 0
        self._tps_hist: list[float] = []
        self._frame = self._make_frame()

    # -- the Runner interface -----------------------------------------------------------------------
    @property
    def frame(self) -> Frame:
        return self._frame

    def now(self) -> float:
        return round(time.monotonic() - self._t0, 6)

    def start(self) -> VllmRunner:
        """Read /v1/models and /metrics once. ConnectionError with a one-line reason if this is
        not a vLLM-compatible server."""
        try:
            models = self.http.get(f"{self.url}/v1/models")
            if models.status_code != 200:
                raise ValueError(f"GET /v1/models answered {models.status_code}")
            first = models.json()["data"][0]
            self.model_name = str(first["id"])
            self.max_len = int(first.get("max_model_len") or 0) or UNKNOWN_MAX_LEN
            self._scrape()
        except (httpx.HTTPError, ValueError, KeyError, TypeError, IndexError) as e:
            raise ConnectionError(f"{self.url}: {why(e)}") from None
        self.status = "ready"
        if self.kv_events is not None:
            self.kv_events.on_view = self._cache_changed
            self.kv_events.start()
        self._publish()
        return self

    def send(self, cmd) -> None:
        if isinstance(cmd, Submit):
            rid = self._new_request(cmd)
            threading.Thread(target=self._complete, args=(rid, cmd), daemon=True, name="completion").start()
        elif isinstance(cmd, Abort):
            self._abort(cmd.rid)
        elif isinstance(cmd, AbortAll):
            for rid in list(self._streams):
                self._abort(rid)
        elif isinstance(cmd, LoadWorkload):
            self._note("info", f"{cmd.loaded()}, sent at their arrival times")
            threading.Thread(
                target=send_workload, args=(cmd, self.send, self._stop), daemon=True, name="workload"
            ).start()

    def stop(self) -> None:
        self._stop.set()
        if self.kv_events is not None:
            self.kv_events.stop()
        for rid in list(self._streams):
            self._abort(rid, quiet=True)

    def run(self, cancelled: Callable[[], bool] = lambda: False) -> None:
        """Poll /metrics; on failure say so and retry with backoff, counting down to each try."""
        tries = 0
        while not (self._stop.is_set() or cancelled()):
            try:
                if self.status == "disconnected":
                    self._publish("retrying…")  # (a scrape may take its whole timeout)
                self._scrape()
                if self.status != "ready":
                    self.status = "ready"
                    self._note("info", f"reconnected to {self.url}")
                tries = 0
            except (httpx.HTTPError, MetricsError) as e:
                wait = RETRY_S[min(tries, len(RETRY_S) - 1)]
                tries += 1
                self._disconnected(why(e))
                self._count_down(wait)
                continue
            self._stop.wait(self.poll_s)

    # -- metrics --------------------------------------------------------------------------------------
    def _scrape(self) -> None:
        r = self.http.get(f"{self.url}/metrics")
        if r.status_code != 200:
            raise MetricsError(f"GET /metrics answered {r.status_code}")
        old, fig = self._figures, self._window.add(parse(r.text))
        self._figures = fig
        if fig.preemptions > old.preemptions and self._seq > 1:
            self._note(
                "preempt",
                f"the server preempted {fig.preemptions - old.preemptions:g} request(s) ({fig.preemptions:g} in all)",
            )
        self._tps_hist = (self._tps_hist + [fig.generation_tps])[-120:]
        self._publish()

    # -- this app's requests ----------------------------------------------------------------------------
    def _new_request(self, cmd: Submit) -> int:
        with self._lock:
            rid = len(self._views)
            s = cmd.settings
            self._views[rid] = RequestView(
                rid=rid,
                state="queued",
                slot=None,
                prompt=tuple(cmd.tokens or ()),
                tokens=(),
                max_new_tokens=s.max_new_tokens,
                sampling=s.sampling,
                eos_id=None,
                arrival_s=self.now(),
                first_token_s=None,
                finish_s=None,
                preemptions=0,
            )
            self._texts[rid], self._prompts[rid] = "", cmd.prompt
        self._event("queued", rid, len(cmd.tokens or ()))
        self._note(
            "submit",
            f"#{rid} sent ({cmd.settings.max_new_tokens} max new tokens, {cmd.settings.sampling.describe()})",
            rid,
        )
        return rid

    def _complete(self, rid: int, cmd: Submit) -> None:
        body = completion_body(cmd)
        body.update(model=self.model_name, stream_options={"include_usage": True})
        body.pop("top_k", None) if cmd.settings.sampling.top_k is None else None
        try:
            with self.http.stream("POST", f"{self.url}/v1/completions", json=body) as r:
                if r.status_code != 200:
                    r.read()
                    if r.status_code == 400:
                        self._refused(cmd)
                    self._end(rid, "failed", f"request refused: {api_error(r)}")
                    return
                with self._lock:
                    self._streams[rid] = r
                reason = None
                for line in r.iter_lines():
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    if "error" in chunk:
                        self._end(rid, "failed", str(chunk["error"].get("message", chunk["error"])))
                        return
                    for choice in chunk.get("choices", ()):
                        self._tokens(rid, choice.get("text", ""))
                        reason = choice.get("finish_reason") or reason
                    if chunk.get("usage"):
                        self._usage(rid, chunk["usage"])
                self._end(rid, "finished", reason or "")
        except (httpx.HTTPError, httpx.StreamError, ValueError, RuntimeError) as e:
            if rid in self._closed:
                self._end(rid, "aborted", "")
            elif not self._stop.is_set():
                streaming = rid in self._streams  # (cut off mid-stream, not unsent)
                self._end(rid, "failed", self._failed(cmd, rid if streaming else None, e).removeprefix(f"#{rid}: "))
        finally:
            with self._lock:
                self._streams.pop(rid, None)

    def _tokens(self, rid: int, text: str) -> None:
        """One streamed chunk: vLLM sends one per generated token."""
        with self._lock:
            v = self._views[rid]
            first = v.first_token_s is None
            self._views[rid] = replace(
                v, state="running", tokens=v.tokens + (0,), first_token_s=self.now() if first else v.first_token_s
            )
            self._texts[rid] += text
        if first:
            self._event("admitted", rid)
            self._event("prefill", rid, reason=f"0..{len(v.prompt)} of {len(v.prompt)}")
            self._note("admit", f"#{rid} first token after {duration(self._views[rid].ttft_s)}", rid)

    def _usage(self, rid: int, usage: dict) -> None:
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        with self._lock:
            v = self._views[rid]
            n = int(usage.get("completion_tokens") or len(v.tokens))
            self._views[rid] = replace(v, tokens=(0,) * n, cached_tokens=int(cached))

    def _end(self, rid: int, state: str, why_: str) -> None:
        with self._lock:
            v = self._views[rid]
            if v.state in ENDED_STATES:
                return
            self._views[rid] = replace(v, state=state, finish_s=self.now(), error=why_ if state == "failed" else None)
        self._event(state, rid, len(v.tokens), why_)
        if state == "finished":
            self._note("finish", f"#{rid} finished: {len(v.tokens)} tokens ({why_ or '?'})", rid)
        elif state == "aborted":
            self._note("abort", f"#{rid} aborted after {len(v.tokens)} tokens (its stream closed)", rid)
        else:
            self._note("error", f"#{rid}: {why_}", rid)

    def _abort(self, rid: int, quiet: bool = False) -> None:
        with self._lock:
            r = self._streams.pop(rid, None)
            if r is not None:
                self._closed.add(rid)
        if r is not None:
            hang_up(r)  # vLLM aborts a request whose client left
            self._end(rid, "aborted", "")
        elif not quiet:
            self._note(
                "info",
                f"#{rid} is not one of this app's running requests: a vLLM server aborts a "
                f"request only when its own client closes it",
            )

    # -- frames -----------------------------------------------------------------------------------------
    def _tick(self) -> int:
        return int(time.monotonic() - self._t0)

    def _event(self, kind: str, rid: int, tokens: int = 0, reason: str = "") -> None:
        with self._lock:
            self._timeline.feed([LifecycleEvent(kind, rid, self._tick(), self.now(), None, tokens, reason)])
        self._publish()

    def _note(self, kind: str, text: str, rid: int | None = None) -> None:
        with self._lock:
            seq = self._log[-1].seq + 1 if self._log else 1
            self._log = (
                self._log + [LogEntry(seq=seq, step=self._tick(), time_s=self.now(), kind=kind, text=text, rid=rid)]
            )[-LOG_LINES:]
        self._publish()

    def _make_frame(self, detail: str = "") -> Frame:
        fig = self._figures
        with self._lock:
            views = tuple(self._views.values())
            texts, prompts, log, tracks = (
                dict(self._texts),
                dict(self._prompts),
                tuple(self._log),
                self._timeline.tracks(),
            )
        blocks = fig.num_blocks or 0
        reserved = blocks * (fig.block_size or 0)
        kv = KVView(
            kind="paged",
            reserved_tokens=reserved,
            allocated_tokens=round(fig.kv_usage * reserved),
            used_tokens=0,
            bytes_per_token=0,
            block_size=fig.block_size,
            n_blocks=blocks or None,
            free_blocks=blocks - round(fig.kv_usage * blocks) if blocks else None,
            dtype="" if fig.cache_dtype == "auto" else fig.cache_dtype,
        )  # auto: the model's, not said
        snap = EngineSnapshot(
            time_s=self.now(),
            n_slots=0,
            max_len=self.max_len,
            slots=(),
            requests=views,
            queue=(),
            kv=kv,
            counters=Counters(steps=self._tick(), preemptions=int(fig.preemptions)),
        )
        with self._lock:
            self._seq += 1
            seq = self._seq
        status = self.status if not detail else f"{self.status}: {detail}"
        return Frame(
            seq=seq,
            snapshot=snap,
            prompts=prompts,
            texts=texts,
            log=log,
            tokens_per_s=fig.generation_tps,
            tps_history=tuple(self._tps_hist),
            status=status,
            tracks=tracks,
            server=fig,
            kv_cache=self.kv_events.view if self.kv_events is not None else None,
        )

    def _publish(self, detail: str = "") -> None:
        self._frame = self._make_frame(detail)

    def _cache_changed(self, view) -> None:
        """The subscriber's thread has a new prefix-cache view: the newest frame with it, as a new
        frame (the app draws a frame it has not drawn), its status line kept."""
        with self._lock:
            self._seq += 1
            seq = self._seq
        self._frame = replace(self._frame, seq=seq, kv_cache=view)
