"""The ASGI app: OpenAI's completions and models routes, health, Prometheus metrics.

Handlers run in the asyncio event loop and never touch the engine: they tokenize, validate,
submit to the EngineLoop and await their request's tokens. Every error a client can cause is a
400 in OpenAI's JSON shape (unknown routes: 404, same shape); the engine thread only ever sees
requests that passed these checks, and even a request it refuses is answered, not raised.

A client that goes away aborts its request at once: streaming and non-streaming responses both
watch the connection for ``http.disconnect`` while they wait, and abort on it (freeing the
request's slot and KV blocks), rather than noticing only at the next write.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from tinyllm.request import Request as EngineRequest
import tinyllm.serve.protocol as protocol
from tinyllm.serve.engine_loop import EngineLoop, EngineLoopStopped, RequestFailed, RequestHandle, RequestRejected
from tinyllm.serve.metrics import CONTENT_TYPE_LATEST, ServeMetrics
from tinyllm.serve.protocol import ApiError
from tinyllm.serve.stream import add_stream_route

log = logging.getLogger("tinyllm.serve")
REQUEST_ID_HEADER = "x-tinyllm-request-id"      # the engine's id for the request (its row in the viewers)


def create_app(engine_loop: EngineLoop, tokenizer: Any, model_name: str,
               metrics: ServeMetrics | None = None) -> FastAPI:
    """The server's app over ``engine_loop`` (not started yet: the app's lifespan starts it and
    stops it at shutdown). ``metrics``: pass one to share it; by default a new ServeMetrics is
    made and registered as a step hook. The engine's config (vocab, max_len) is read here, once,
    before the engine thread runs."""
    engine = engine_loop.engine
    vocab_size, max_len = engine.model.cfg.vocab_size, engine.max_len
    if metrics is None:
        metrics = ServeMetrics(model_name)
        engine_loop.add_step_hook(metrics.on_step)
    metrics.set_cache_config(engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine_loop.start()
        try:
            yield
        finally:
            await asyncio.to_thread(engine_loop.stop)

    app = FastAPI(title="tinyllm", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine_loop = engine_loop
    app.state.metrics = metrics
    app.state.model_name = model_name
    created = int(time.time())

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        msg = (f"Invalid URL ({request.method} {request.url.path})" if e.status_code == 404
               else f"{e.detail} ({request.method} {request.url.path})")
        return JSONResponse(protocol.error_body(msg, code={404: "not_found", 405: "method_not_allowed"}
                                                .get(e.status_code)), status_code=e.status_code,
                            headers=getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        return JSONResponse(protocol.error_body(str(e)), status_code=400)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception) -> JSONResponse:     # a bug: say so, keep serving
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return JSONResponse(protocol.error_body(f"internal error: {type(e).__name__}", "internal_server_error"),
                            status_code=500)

    @app.get("/health")
    async def health() -> JSONResponse:
        if not engine_loop.alive:
            return JSONResponse(protocol.error_body("the engine loop is not running", "server_error"),
                                status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": created, "owned_by": "tinyllm", "root": model_name,
             "max_model_len": max_len}]})

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        try:
            raw = await request.body()
        except ClientDisconnect:                           # gone before the body arrived: nothing to do
            return Response(status_code=499)
        p = protocol.parse_completion(protocol.load_json(raw), model_name)
        ids = list(p.prompt_ids) if p.prompt_ids is not None else tokenizer.encode(p.prompt_text)
        protocol.check_prompt(ids, p.max_tokens, vocab_size, max_len)
        eos = None if p.ignore_eos else tokenizer.eos_id
        req = EngineRequest(ids, p.max_tokens, eos_id=eos, sampling=p.sampling)
        try:
            handle = engine_loop.submit(req)
        except EngineLoopStopped as e:
            raise ApiError(str(e), None, None, 503, "server_error") from None
        try:
            await handle.accepted()
        except RequestRejected as e:
            code = "context_length_exceeded" if e.context_too_long else "invalid_value"
            raise ApiError(str(e), "prompt", code) from None
        except RequestFailed as e:
            raise ApiError(str(e), None, None, 503, "server_error") from None
        except BaseException:                              # cancelled while waiting: do not leak it
            handle.close()
            raise
        if p.stream:
            return CompletionStream(handle, tokenizer, p, ids, model_name)
        return await _complete(request, handle, tokenizer, p, ids, model_name)

    app.state.feed = add_stream_route(app, engine_loop, tokenizer, model_name, {    # see tinyllm/serve/stream.py
        "slots": engine.n_slots, "max_len": max_len, "kv": engine.kv_kind,
        "max_batched_tokens": engine.max_batched_tokens, "prefix_cache": engine.prefix_cache})
    return app


async def _wait_disconnect(receive: Receive) -> None:
    """Return when the client has gone (the request body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _complete(request: Request, handle: RequestHandle, tokenizer, p: protocol.CompletionParams,
                    prompt: list[int], model: str) -> Response:
    """A non-streaming completion, aborted if the client disconnects while it is generated."""
    async def collect() -> tuple[list[int], str, int]:
        toks: list[int] = []
        while True:
            out = await handle.next_output()
            toks += out.tokens
            if out.finished:
                return toks, out.finish_reason, out.cached_tokens

    work = asyncio.ensure_future(collect())
    gone = asyncio.ensure_future(_wait_disconnect(request.receive))
    try:
        await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
            handle.close()                                 # client gone (or we were cancelled): abort
    if not work.done() or work.cancelled():
        return Response(status_code=499)                   # nobody reads it
    try:
        toks, reason, cached = work.result()
    except RequestFailed as e:
        raise ApiError(str(e), None, None, 500, "server_error") from None
    text = tokenizer.decode(toks, skip_special_tokens=True)
    ids = toks if p.return_token_ids else None
    return JSONResponse(protocol.completion(protocol.new_completion_id(), model, text, reason,
                                            protocol.usage(len(prompt), len(toks), cached), ids,
                                            prompt if p.return_token_ids else None),
                        headers={REQUEST_ID_HEADER: str(handle.rid)})


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class CompletionStream(Response):
    """Server-sent events in OpenAI's format, ending with ``data: [DONE]``. Runs the stream and
    a disconnect watcher side by side; whichever ends first ends the other, and a request whose
    client went away is aborted at once (not at the next token write)."""

    media_type = "text/event-stream"

    def __init__(self, handle: RequestHandle, tokenizer, p: protocol.CompletionParams, prompt: list[int],
                 model: str):
        self.status_code, self.background = 200, None       # no body: no content-length (as StreamingResponse)
        self.init_headers({"cache-control": "no-cache", REQUEST_ID_HEADER: str(handle.rid)})
        self.handle, self.tok, self.p, self.prompt, self.model = handle, tokenizer, p, prompt, model

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pump = asyncio.ensure_future(self._pump(send))
        gone = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await asyncio.wait((pump, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            pump.cancel()
            self.handle.close()                            # no-op once the request finished
        if pump.done() and not pump.cancelled() and pump.exception() is not None:
            e = pump.exception()
            if not isinstance(e, OSError):                 # a write to a closed connection is expected
                log.error("completion stream failed: %r", e)

    async def _pump(self, send: Send) -> None:
        p, h = self.p, self.handle
        cid, created = protocol.new_completion_id(), int(time.time())
        stream = self.tok.stream(skip_special_tokens=True)
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        first, n = True, 0
        try:
            while True:
                out = await h.next_output()
                n += len(out.tokens)
                text = "".join(stream.step(t) for t in out.tokens)
                if text or out.finished or p.return_token_ids:
                    ids = list(out.tokens) if p.return_token_ids else None
                    c = protocol.chunk(cid, created, self.model, text, out.finish_reason, p.include_usage, ids,
                                       self.prompt if first and p.return_token_ids else None)
                    first = False
                    await send({"type": "http.response.body", "body": _sse(c), "more_body": True})
                if out.finished:
                    break
            if p.include_usage:
                u = protocol.usage_chunk(cid, created, self.model,
                                         protocol.usage(len(self.prompt), n, out.cached_tokens))
                await send({"type": "http.response.body", "body": _sse(u), "more_body": True})
        except RequestFailed as e:                          # the engine failed it: say so in the stream
            await send({"type": "http.response.body", "more_body": True,
                        "body": _sse(protocol.error_body(str(e), "server_error"))})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
