"""Putting it together: the engine the server runs, and uvicorn around the app.

The engine defaults to what the app (``tui``) runs: paged KV, chunked prefill (the token-budget
scheduler) and the prefix cache, so long prompts do not stall decodes and repeated prompt
prefixes are served from cache. ``run_server`` is the CLI's blocking server (uvicorn handles
Ctrl+C: a graceful shutdown, then one line saying so); ``ServerThread`` runs the same server in
a background thread, for tests and embedding.
The listening socket is bound before uvicorn starts, so a busy port is a plain OSError the CLI
turns into one line, and port 0 (any free port) reports the port really taken.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

from tinyllm.config import EngineConfig
from tinyllm.kv.blocks import check_pool_holds_one_request
from tinyllm.serve.app import create_app
from tinyllm.serve.connections import guarded_protocol
from tinyllm.serve.engine_loop import EngineLoop, StepHook
from tinyllm.serve.recorder import RecordTo
from tinyllm.serve.security import Limits

BUNDLED_MODEL_NAME = "tinyllm-shakespeare"
SERVER_CONFIG = EngineConfig.best(seed=0)  # paged KV, chunked prefill, the prefix cache (as tinyllm-tui by default)
GRACEFUL_SHUTDOWN_S = 3  # at shutdown, open connections get this long to close, then are cancelled


def model_name_for(model_dir: str | None) -> str:
    """The id /v1/models reports: the model directory's name, or the bundled model's name."""
    return BUNDLED_MODEL_NAME if model_dir is None else Path(model_dir).resolve().name


def build_engine(model: Any, slots: int | None = None, *, config: EngineConfig | None = None, **settings: Any):
    """The server's ContinuousEngine. ``config`` (default ``SERVER_CONFIG``: paged KV, chunked
    prefill, the prefix cache, seed 0; ``tinyllm serve`` builds it from its options) with
    EngineConfig's ``settings`` replaced, and ``slots`` as its cap on running sequences (the
    same setting as ``max_num_seqs``: give one). Raises ValueError with a user-facing message for
    bad settings, a pool too small for one request of max_len included."""
    if slots is not None and "max_num_seqs" in settings:
        raise ValueError(f"slots ({slots}) and max_num_seqs ({settings['max_num_seqs']}) name the same cap; give one")
    from tinyllm.engine import ContinuousEngine

    config = (config or SERVER_CONFIG).replace(**settings, **({} if slots is None else {"max_num_seqs": slots}))
    engine = ContinuousEngine(model, config=config)
    check_pool_holds_one_request(engine.slots.n_blocks, engine.slots.block_size, engine.max_len)
    return engine


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (IPv6 when host is one). Raises OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Server(uvicorn.Server):
    """uvicorn's server, with a callback once it is really listening (after the lifespan
    startup that starts the engine thread), and the engine loop stopped as shutdown begins: its
    unfinished requests end at once (streams get an error event and [DONE]; viewers a last record
    with them aborted, so no viewer is left showing them running), so uvicorn's wait for open
    connections is short instead of the whole graceful timeout."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None] | None = None):
        super().__init__(config)
        self.on_ready = on_ready
        self.interrupted = False  # a Ctrl+C (SIGINT) began the shutdown

    def handle_exit(self, sig: int, frame) -> None:
        if sig == signal.SIGINT:
            self.interrupted = True
        super().handle_exit(sig, frame)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.on_ready is not None and not self.should_exit:
            self.on_ready()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        state = getattr(self.config.app, "state", None)
        engine_loop = getattr(state, "engine_loop", None)
        if engine_loop is not None:  # first: the requests it ends reach the viewers
            await asyncio.to_thread(engine_loop.stop)
        feed = getattr(state, "feed", None)
        if feed is not None:
            feed.close()  # viewers' streams end now, not at the timeout
        await super().shutdown(sockets)


def make_server(app: Any, on_ready: Callable[[], None] | None = None, log_level: str = "warning") -> _Server:
    """uvicorn around ``app``, with the app's ``limit_concurrency`` (tinyllm.serve.security.Limits)."""
    limits = getattr(getattr(app, "state", None), "limits", None) or Limits()
    config = uvicorn.Config(
        app,
        http=guarded_protocol(limits.header_timeout_s, limits.idle_per_client),  # connections.py
        lifespan="on",
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        limit_concurrency=limits.limit_concurrency,
    )
    return _Server(config, on_ready)


def run_server(
    engine: Any,
    tokenizer: Any,
    model_name: str,
    sock: socket.socket,
    on_step: StepHook | None = None,
    api_key: str | None = None,
    limits: Limits | None = None,
    slo: Any = None,
    record: RecordTo | None = None,
    exposure: Any = None,
    admin_key: str | None = None,
) -> None:
    """Serve ``engine`` on the listening ``sock`` until Ctrl+C / SIGTERM, printing the URL once
    uvicorn is listening. The engine thread is stopped before this returns; after Ctrl+C it
    prints "stopped" and raises KeyboardInterrupt (the CLI's exit 130). ``api_key`` and
    ``limits``: see tinyllm/serve/security.py; ``exposure``: tinyllm/serve/guard.py; ``record``: --record (tinyllm/serve/recorder.py),
    closed on the way out, Ctrl+C included."""
    loop = EngineLoop(engine, on_step=on_step)
    app = create_app(
        loop,
        tokenizer,
        model_name,
        api_key=api_key,
        limits=limits,
        slo=slo,
        record=record,
        exposure=exposure,
        admin_key=admin_key,
    )
    url = url_of(sock)
    recording = "" if record is None else f"; recording to {record.path}{'' if record.text else ', text left out'}"

    def ready() -> None:
        from tinyllm.engine.forward import kv_cache_dtype_name

        e = engine
        print(
            f"tinyllm serve: {model_name} on {url}  (OpenAI API at {url}/v1; {e.n_slots} slots, max_len "
            f"{e.max_len}, {e.slots.n_blocks} KV blocks of {e.slots.block_size} "
            f"({kv_cache_dtype_name(e.device, e.kv_cache_dtype)}), prefix cache "
            f"{'on' if e.prefix_cache else 'off'}{'; API key required' if api_key else ''}{recording}; Ctrl+C stops)",
            flush=True,
        )

    server = make_server(app, ready)
    try:
        server.run(sockets=[sock])
        if server.interrupted:  # uvicorn re-raises the Ctrl+C it caught once it has shut down;
            raise KeyboardInterrupt  # a CI run once saw that not come back as one (exit 0): say it here
    except KeyboardInterrupt:  # uvicorn shut down cleanly, then re-raised the Ctrl+C it caught
        # "\r": over the terminal's "^C" echo, so the line reads clean; the caller exits 130
        print(("\r" if sys.stdout.isatty() else "") + "tinyllm serve: stopped (Ctrl+C)", flush=True)
        raise
    finally:
        loop.stop()
        sock.close()


class ServerThread:
    """The server in a background thread of this process, on host:port (0: any free port).
    ``with ServerThread(app) as s: httpx.get(s.url + "/health")``; ``s.engine_loop`` reaches the
    engine (``s.engine_loop.call(lambda e: e.snapshot())``)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0):
        self.app = app
        self.engine_loop: EngineLoop = app.state.engine_loop
        self._sock = bind(host, port)
        self.url = url_of(self._sock)
        self._ready = threading.Event()
        self.server = make_server(app, self._ready.set)
        self._thread = threading.Thread(target=self._run, name="tinyllm-serve", daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self._sock])
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self._error = e
        finally:
            self._ready.set()

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None or not self.server.started:
            self.stop()
            raise RuntimeError(f"the server did not start: {self._error!r}")
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Shut down: the engine loop first (unfinished requests end at once), then uvicorn."""
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.engine_loop.stop()
        self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
