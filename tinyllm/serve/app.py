"""The ASGI app: OpenAI's completions, chat completions and models routes, vLLM's tokenize and
detokenize, health, Prometheus metrics.

Handlers run in the asyncio event loop and never touch the engine: they tokenize (in a worker
thread, as a long text takes seconds; a prompt text too long to fit however it tokenizes is
refused before that), validate, submit to the EngineLoop and await their request's tokens. Every error a client can cause is a
400 in OpenAI's JSON shape (unknown routes: 404, same shape); the engine thread only ever sees
requests that passed these checks, and even a request it refuses is answered, not raised.

A client that goes away aborts its request at once: streaming and non-streaming responses both
watch the connection for ``http.disconnect`` while they wait, and abort on it (freeing the
request's slot and KV blocks), rather than noticing only at the next write.

Both generation routes share one path (``_serve``, answering through ``respond.py``): they differ
in how the body is parsed (the sampling fields by the one ``parse_generation``), how the prompt is
made (chat: the checkpoint's template) and the shape of the answer (``CompletionShape`` /
``ChatShape``). Each final response,
and the last chunks of a stream, carry the request's accounting in a ``"tinyllm"`` field
(tinyllm/observe/accounting.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from tinyllm.engine.scoring import prompt_logprobs
from tinyllm.request import Request as EngineRequest
from tinyllm.request import SamplingError
from tinyllm.serve.body import ApiError, error_body, read_json, request_error
from tinyllm.serve.chat import ChatShape, parse_chat
from tinyllm.serve.chat_template import ChatTemplateError, render
from tinyllm.serve.completions import CompletionShape, Echo, Piece, echo_logprobs, usage
from tinyllm.serve.engine_loop import EngineLoop, EngineLoopStopped
from tinyllm.serve.fit import check_prompt, check_text_fits
from tinyllm.serve.guard import Exposure, GuardMiddleware
from tinyllm.serve.handle import RequestFailed, RequestRejected
from tinyllm.serve.metrics import CONTENT_TYPE_LATEST, ServeMetrics
from tinyllm.serve.protocol import CompletionParams, GenerationParams, api_key_tenant, parse_completion
from tinyllm.serve.recorder import RecordTo, ServerRecorder
from tinyllm.serve.respond import CompletionStream, Job, close_all, complete
from tinyllm.serve.security import (
    RETRY_AFTER_S,
    TOKENIZE_CHARS_PER_TOKEN,
    ApiKeyMiddleware,
    BodyLimitMiddleware,
    ErrorLogMiddleware,
    Limits,
    read_body,
)
from tinyllm.serve.stream import add_stream_route
from tinyllm.serve.tokenization import max_token_bytes, parse_detokenize, parse_tokenize, tokenize_response
from tinyllm.slo import SLO

log = logging.getLogger("tinyllm.serve")


def create_app(
    engine_loop: EngineLoop,
    tokenizer: Any,
    model_name: str,
    metrics: ServeMetrics | None = None,
    api_key: str | None = None,
    limits: Limits | None = None,
    slo: SLO | None = None,
    record: RecordTo | None = None,
    exposure: Exposure | None = None,
    admin_key: str | None = None,
) -> FastAPI:
    """The server's app over ``engine_loop`` (not started yet: the app's lifespan starts it and
    stops it at shutdown). ``metrics``: pass one to share it; by default a new ServeMetrics is
    made and registered as a step hook. The engine's config (vocab, max_len) is read here, once,
    before the engine thread runs. ``api_key``: every route but /health and /metrics needs it
    (tinyllm/serve/security.py); ``limits``: what a client may send (default: Limits());
    ``admin_key``: the operator's, for the observer routes (tinyllm/serve/security.py);
    ``record``: --record FILE, the server's recording (tinyllm/serve/recorder.py); ``exposure``:
    where it listens and which Hosts and Origins it answers (tinyllm/serve/guard.py; default:
    loopback)."""
    limits = limits or Limits()
    max_body = limits.max_body_bytes
    engine = engine_loop.engine
    vocab_size, max_len = engine.model.cfg.vocab_size, engine.max_len
    room = min(max_len, engine.slots.reserved_tokens())  # the most context one request can hold
    token_bytes = max_token_bytes(tokenizer)  # None: no bound, every prompt is tokenized
    if metrics is None:
        metrics = ServeMetrics(model_name, max_len, slo)  # slo: --slo, counted in /metrics
        engine_loop.add_step_hook(metrics.on_step)
    metrics.set_cache_config(engine)
    # /tokenize and /detokenize work on a thread of their own: a client sending long texts there
    # waits for itself, not for the pool the generation routes tokenize their prompts on.
    tokenize_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinyllm-tokenize")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine_loop.start()
        recorder = app.state.recorder
        if recorder is not None:
            await recorder.start()
        try:
            yield
        finally:
            tokenize_pool.shutdown(wait=False, cancel_futures=True)
            await asyncio.to_thread(engine_loop.stop)
            if recorder is not None:  # after the stop: its last record holds the requests it ended
                await recorder.close()

    app = FastAPI(title="tinyllm", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine_loop = engine_loop
    app.state.metrics = metrics
    app.state.model_name = model_name
    app.state.limits = limits
    app.add_middleware(BodyLimitMiddleware, limit=max_body)
    if api_key or admin_key:  # (added last: the outer one, so a client without the key learns nothing else)
        app.add_middleware(ApiKeyMiddleware, api_key=api_key, admin_key=admin_key)
    app.add_middleware(GuardMiddleware, exposure=exposure or Exposure())  # Host, Origin, JSON: before the key
    app.add_middleware(ErrorLogMiddleware)  # outermost: sees every answer, the 401s and 403s included
    created = int(time.time())

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, e: ClientDisconnect) -> Response:  # before its body arrived: nothing to do
        return Response(status_code=499)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        msg = (
            f"Invalid URL ({request.method} {request.url.path})"
            if e.status_code == 404
            else f"{e.detail} ({request.method} {request.url.path})"
        )
        return JSONResponse(
            error_body(msg, code={404: "not_found", 405: "method_not_allowed"}.get(e.status_code)),
            status_code=e.status_code,
            headers=getattr(e, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(str(e)), status_code=400)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception) -> JSONResponse:  # a bug: say so, keep serving
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return JSONResponse(error_body(f"internal error: {type(e).__name__}", "internal_server_error"), status_code=500)

    @app.get("/health")
    async def health() -> JSONResponse:
        if not engine_loop.alive:
            return JSONResponse(error_body("the engine loop is not running", "server_error"), status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": model_name,
                        "object": "model",
                        "created": created,
                        "owned_by": "tinyllm",
                        "root": model_name,
                        "max_model_len": max_len,
                    }
                ],
            }
        )

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    def check_room(n: int) -> None:
        """A 429 if ``n`` more requests would wait beyond --max-waiting. Checked once as a
        generation request arrives (a full queue refuses it before its body is parsed and its
        prompt tokenized: at once, under load) and again just before it is submitted."""
        if n > limits.max_waiting:  # could never wait here: a retry would loop forever
            raise ApiError(
                f"n is {n}: more samples than this server lets wait at once ({limits.max_waiting}, "
                "--max-waiting); ask for fewer",
                "n",
                "invalid_value",
            )
        waiting = engine_loop.waiting()
        if waiting + n > limits.max_waiting:
            raise ApiError(
                f"the server is busy: {waiting} requests wait for a slot, its limit is "
                f"{limits.max_waiting} (--max-waiting); retry later",
                None,
                "max_waiting_exceeded",
                429,
                "rate_limit_error",
                {"retry-after": str(RETRY_AFTER_S)},
            )

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        check_room(1)
        raw = await read_body(request, max_body)
        p = parse_completion(await read_json(raw), model_name)
        if p.prompt_ids is not None:
            ids = list(p.prompt_ids)
        else:
            check_text_fits(p.prompt_text, token_bytes, p.max_tokens, max_len, room, p.max_tokens_field)
            ids = await asyncio.to_thread(tokenizer.encode, p.prompt_text)
        check_prompt(ids, p.max_tokens, vocab_size, max_len, room, p.max_tokens_field)
        echo = await _echo(p, ids) if p.echo else None
        if echo is not None and p.max_tokens == 0:
            return _echo_only(p, ids, echo)
        return await _serve(request, p, ids, CompletionShape, echo)

    async def _echo(p: CompletionParams, ids: list[int]) -> Echo:
        """The prompt ``echo`` returns: its text as sent (token ids: decoded), and with ``logprobs``
        its tokens' logprobs, from one scoring pass of the model in the engine thread."""
        text = p.prompt_text if p.prompt_text is not None else await asyncio.to_thread(tokenizer.decode, ids)
        if p.logprobs is None:
            return Echo(text, None)
        try:
            lps = await engine_loop.call_async(lambda eng: prompt_logprobs(eng.model, ids, p.logprobs))
        except EngineLoopStopped as e:
            raise ApiError(str(e), None, None, 503, "server_error") from None
        return Echo(text, echo_logprobs(ids, lps, tokenizer.token_text))

    def _echo_only(p: CompletionParams, ids: list[int], echo: Echo) -> Response:
        """``echo`` with ``max_tokens: 0``: the prompt and its logprobs, nothing generated (what an
        evaluation harness asks to score a continuation), whole or as one chunk per choice."""
        cid, created = CompletionShape.new_id(), int(time.time())
        piece = Piece(echo.text, "length", *(([], ids) if p.return_token_ids else ()))
        use = usage(len(ids), 0, 0)
        if not p.stream:
            body = CompletionShape.response(cid, model_name, piece, use)
            body["choices"] = [dict(body["choices"][0], index=i, logprobs=echo.logprobs) for i in range(p.n)]
            return JSONResponse(body)
        events = []
        for i in range(p.n):
            c = CompletionShape.chunk(cid, created, model_name, piece, p.include_usage)
            c["choices"][0].update(index=i, logprobs=echo.logprobs)
            events.append(c)
        if p.include_usage:
            events.append(CompletionShape.usage_chunk(cid, created, model_name, use))
        sse = b"".join(b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n" for e in events)
        return Response(sse + b"data: [DONE]\n\n", media_type="text/event-stream")

    def render_chat(messages, add_generation_prompt: bool) -> str:
        try:
            return render(tokenizer.chat_template, list(messages), add_generation_prompt, tokenizer.special_tokens)
        except ChatTemplateError as e:
            raise ApiError(str(e), "messages", "invalid_chat_template") from None

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        check_room(1)
        raw = await read_body(request, max_body)
        p = parse_chat(await read_json(raw), model_name)
        text = await asyncio.to_thread(
            render_chat, p.messages, p.add_generation_prompt
        )  # a template's work: off the loop
        try:
            check_text_fits(text, token_bytes, p.max_tokens or 1, max_len, room, p.max_tokens_field)
            ids = await asyncio.to_thread(tokenizer.encode, text)
            # no max_tokens: what the context leaves (as OpenAI and vLLM), within what one request may hold
            max_tokens = p.max_tokens if p.max_tokens is not None else max(1, room - len(ids))
            check_prompt(ids, max_tokens, vocab_size, max_len, room, p.max_tokens_field)
        except ApiError as e:
            e.param = "messages" if e.param == "prompt" else e.param
            raise
        return await _serve(request, replace(p, max_tokens=max_tokens), ids, ChatShape)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        raw = await read_body(request, max_body)
        t = parse_tokenize(await read_json(raw), model_name)
        where = "prompt" if t.prompt is not None else "messages"

        def work() -> dict:  # on its own thread: the text may be long (see tokenize_pool)
            text = t.prompt if t.prompt is not None else render_chat(t.messages, t.add_generation_prompt)
            most = limits.max_tokenize_tokens * TOKENIZE_CHARS_PER_TOKEN
            if len(text) > most:  # bounded before the work: a 1 MiB text took 3 s of a core
                raise ApiError(
                    f"the text is {len(text)} characters, more than /tokenize takes: at most {most} "
                    f"({TOKENIZE_CHARS_PER_TOKEN} per token of its limit of {limits.max_tokenize_tokens} "
                    "tokens, --max-tokenize-tokens), refused without tokenizing",
                    where,
                    "too_many_tokens",
                )
            ids = tokenizer.encode(text, t.add_special_tokens)
            if len(ids) > limits.max_tokenize_tokens:
                raise ApiError(
                    f"the text is {len(ids)} tokens, more than the server's limit of "
                    f"{limits.max_tokenize_tokens} tokens for /tokenize",
                    where,
                    "too_many_tokens",
                )
            strs = [tokenizer.token_text(i) for i in ids] if t.return_token_strs else None
            return tokenize_response(ids, max_len, strs)

        return JSONResponse(await asyncio.get_running_loop().run_in_executor(tokenize_pool, work))

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        raw = await read_body(request, max_body)
        ids = parse_detokenize(await read_json(raw), model_name, tokenizer.vocab_size, limits.max_tokenize_tokens)
        text = await asyncio.get_running_loop().run_in_executor(tokenize_pool, tokenizer.decode, ids)
        return JSONResponse({"prompt": text})

    async def _serve(
        request: Request, p: GenerationParams, ids: list[int], shape, echo: Echo | None = None
    ) -> Response:
        """Submit a validated request and answer it in ``shape`` (completions' or chat's)."""
        eos = None if p.ignore_eos else tokenizer.eos_id
        try:
            req = EngineRequest(
                ids,
                p.max_tokens,
                eos_id=eos,
                sampling=p.sampling,
                stop_token_ids=p.stop_token_ids,
                min_tokens=p.min_tokens,
                logprobs=p.logprobs,
                priority=p.priority,
                tenant=p.tenant or api_key_tenant(request.headers.get("authorization")),
            )
        except SamplingError as e:  # e.g. chat's min_tokens above what the context leaves
            raise request_error(e, e.field) from None
        bad = next((t for t in p.stop_token_ids if t >= vocab_size), None)
        if bad is not None:
            raise ApiError(
                f"stop token id {bad} is outside the model's vocabulary [0, {vocab_size})",
                "stop_token_ids",
                "invalid_value",
            )
        check_room(p.n)  # (no await between this and the submit: exact)
        try:
            handles = engine_loop.submit_samples(req, p.n, p.stop)  # n > 1: one prompt, n samples (forks)
        except EngineLoopStopped as e:
            raise ApiError(str(e), None, None, 503, "server_error") from None
        try:
            for handle in handles:
                await handle.accepted()
        except RequestRejected as e:
            code = "context_length_exceeded" if e.context_too_long else "invalid_value"
            raise ApiError(str(e), "prompt", code) from None
        except RequestFailed as e:
            close_all(handles)
            raise ApiError(str(e), None, None, 503, "server_error") from None
        except BaseException:  # cancelled while waiting: do not leak it
            close_all(handles)
            raise
        job = Job(handles, tokenizer, p, ids, model_name, shape, echo)
        return CompletionStream(job) if p.stream else await complete(request, job)

    app.state.feed = add_stream_route(
        app,
        engine_loop,
        tokenizer,
        model_name,
        {  # see tinyllm/serve/stream.py
            "slots": engine.n_slots,
            "max_len": max_len,
            "kv": engine.kv_kind,
            "max_batched_tokens": engine.max_batched_tokens,
            "prefix_cache": engine.prefix_cache,
        },
        max_body,
        limits.max_viewers,
    )
    app.state.recorder = (
        None if record is None else ServerRecorder(record, app.state.feed, engine_loop, vocab_size, slo)
    )
    return app
