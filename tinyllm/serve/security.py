"""What the server trusts a client with: an API key, and limits on what a client sends.

``--api-key KEY`` (or ``TINYLLM_API_KEY``), as vLLM's ``--api-key`` / ``VLLM_API_KEY``: every
route needs ``Authorization: Bearer KEY`` except ``/health`` and ``/metrics``, which stay open
(as in vLLM: load balancers and Prometheus probe them). That includes the observer routes
(``/v1/tinyllm/stream`` shows every client's prompts and outputs, ``/v1/tinyllm/abort`` aborts any
request) and vLLM's ``/tokenize`` / ``/detokenize`` (vLLM leaves those open; they cost CPU). A
request without the key, or with another, gets a 401 in OpenAI's error shape (code
``invalid_api_key``); keys are compared in constant time (``hmac.compare_digest``).

Limits (``Limits``): a request body larger than ``max_body_bytes`` is refused with a 413 while it
arrives (read in chunks, never whole); ``/tokenize`` and ``/detokenize`` take at most
``max_tokenize_tokens`` tokens; a generation request that would make more than ``max_waiting``
requests wait for a slot is refused with a 429 and ``Retry-After`` (nothing admitted is dropped);
uvicorn's ``limit_concurrency`` caps open connections and tasks (beyond it uvicorn itself answers
a plain-text 503); a connection must bring its request's headers within ``header_timeout_s`` and
one client holds at most ``idle_per_client`` connections without a request in flight
(tinyllm/serve/connections.py); a body must arrive within BODY_TIMEOUT_S (408).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import os
import time
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from tinyllm.serve.body import ApiError, error_body
from tinyllm.serve.connections import HEADER_TIMEOUT_S, IDLE_PER_CLIENT

log = logging.getLogger("tinyllm.serve")

API_KEY_ENV = "TINYLLM_API_KEY"
ADMIN_KEY_ENV = "TINYLLM_ADMIN_KEY"
OPEN_PATHS = frozenset({"/health", "/metrics"})  # no key needed (as vLLM): probes and Prometheus
MAX_BODY_BYTES = 1 << 20  # 1 MiB: a request body larger than this is refused (413)
MAX_TOKENIZE_TOKENS = 1 << 16  # /tokenize answers, /detokenize takes, at most this many tokens
TOKENIZE_CHARS_PER_TOKEN = 8  # /tokenize refuses a text over 8 characters per token of that limit untokenized
MAX_WAITING = 256  # requests waiting for a slot; one more is refused (429)
MAX_VIEWERS = 8  # state-stream viewers at once; each costs the engine thread a snapshot per step
LIMIT_CONCURRENCY = 1024  # uvicorn's limit_concurrency: connections + tasks at once
RETRY_AFTER_S = 1  # the Retry-After of a 429
BODY_TIMEOUT_S = 30.0  # a request's body must be in within this of its headers (408 otherwise)


@dataclass(frozen=True)
class Limits:
    """The server's limits on what clients send (see the module docstring)."""

    max_body_bytes: int = MAX_BODY_BYTES
    max_tokenize_tokens: int = MAX_TOKENIZE_TOKENS
    max_waiting: int = MAX_WAITING
    limit_concurrency: int | None = LIMIT_CONCURRENCY
    header_timeout_s: float = HEADER_TIMEOUT_S  # tinyllm/serve/connections.py
    idle_per_client: int = IDLE_PER_CLIENT
    max_viewers: int = MAX_VIEWERS  # GET /v1/tinyllm/stream at once


def api_key_from_env(flag: str | None, option: str = "--api-key", env: str = API_KEY_ENV) -> str | None:
    """The key to require: ``--api-key``, else ``TINYLLM_API_KEY``, else None (no key). A key no
    client could send is a ValueError saying why: empty (``--api-key ""`` silently turned the
    environment's key off), with spaces or control characters (a Bearer token has none: a key
    with spaces around it never matched)."""
    where = option if flag is not None else env
    key = flag if flag is not None else os.environ.get(env)
    if key is None or (flag is None and key == ""):
        return None
    if key == "":
        raise ValueError(f"{option} is empty: give a key, or leave the option out (then ${env} is used)")
    if any(c.isspace() or not c.isprintable() for c in key):
        raise ValueError(
            f"{where} holds spaces or control characters: no client can send those in 'Authorization: Bearer KEY'"
        )
    return key


def is_loopback(host: str) -> bool:
    """Whether ``host`` (what --host binds) is reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposed_without_key_warning(host: str) -> str:
    return (
        f"tinyllm serve: warning: listening on {host} (not loopback) without an API key: anyone who "
        f"reaches the port can generate, read every client's prompts and outputs (/v1/tinyllm/stream) "
        f"and abort any request; pass --api-key KEY or set {API_KEY_ENV}"
    )


def _bearer(scope: Scope) -> bytes | None:
    """The Bearer token as the client sent it, bytes (a UTF-8 key is compared as UTF-8 bytes)."""
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


OBSERVER_PATHS = frozenset({"/v1/tinyllm/stream", "/v1/tinyllm/abort"})  # every client's prompts; anyone's abort


class ApiKeyMiddleware:
    """Pure ASGI (streams and disconnects pass through untouched): who may use which route.

    ``api_key`` (``--api-key``): every route but ``OPEN_PATHS`` needs it (or the admin key).
    ``admin_key`` (``--admin-key``): the operator's; the observer routes (``OBSERVER_PATHS``: the
    state stream shows every client's prompts and outputs, abort ends anyone's request) need it.
    With an API key and no admin key the observer routes are off: a user's key never reads other
    users' prompts. Without either key everything is open (a loopback server's default)."""

    def __init__(self, app: ASGIApp, api_key: str | None, admin_key: str | None = None):
        self.app = app
        self._key = None if api_key is None else api_key.encode("utf-8")
        self._admin = None if admin_key is None else admin_key.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path")
        if scope["type"] != "http" or path in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = _bearer(scope)
        admin = given is not None and self._admin is not None and hmac.compare_digest(given, self._admin)
        user = given is not None and self._key is not None and hmac.compare_digest(given, self._key)
        if path in OBSERVER_PATHS and (admin or user):
            if admin:
                await self.app(scope, receive, send)
                return
            if self._admin is None:  # an API key only: these routes are the operator's
                msg = (
                    f"{path} shows every client's requests (or ends them): it is off on a server without "
                    "an operator key; start it with --admin-key KEY and send that key"
                )
                return await _refuse(scope, receive, send, 403, msg, "admin_key_required")
            msg = f"{path} needs the server's operator key (--admin-key): an API key is not enough"
            return await _refuse(scope, receive, send, 403, msg, "admin_key_required")
        if admin or user or (self._key is None and path not in OBSERVER_PATHS):
            await self.app(scope, receive, send)
            return
        option = "--api-key" if self._key is not None else "--admin-key"
        msg = (
            f"Incorrect API key provided: this server was started with {option}"
            if given
            else f"You didn't provide an API key: send it as 'Authorization: Bearer KEY' (the server's {option})"
        )
        await _refuse(scope, receive, send, 401, msg, "invalid_api_key")


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, msg: str, code: str) -> None:
    headers = {"www-authenticate": "Bearer"} if status == 401 else None
    await JSONResponse(error_body(msg, "invalid_request_error", None, code), status_code=status, headers=headers)(
        scope, receive, send
    )


class ErrorLogMiddleware:
    """Pure ASGI, outermost: one log line for every error answer (status >= 400; 499, a client
    gone, is not one): status, method, path, client and the error's message and param, so a
    failed request (a benchmark's, a harness's) leaves a trace server-side with the access log off."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0

        async def watch(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and 400 <= status != 499:
                log_error_answer(scope, status, message.get("body", b""))
                status = 0  # once per answer
            await send(message)

        await self.app(scope, receive, watch)


BUSY_LOG_EVERY_S = 5.0  # under overload, one line per this long for the 429s (a line each flooded the log)
_busy = {"last": -BUSY_LOG_EVERY_S, "quiet": 0}


def log_error_answer(scope: Scope, status: int, body: bytes) -> None:
    if status == 429:
        now = time.monotonic()
        if now - _busy["last"] < BUSY_LOG_EVERY_S:
            _busy["quiet"] += 1
            return
        _busy["last"], quiet, _busy["quiet"] = now, _busy["quiet"], 0
        if quiet:
            log.warning("429: %d more refused while busy in the last %g s", quiet, BUSY_LOG_EVERY_S)
    client = scope.get("client")
    who = f" from {client[0]}" if client else ""
    why = ""
    try:
        err = json.loads(body)["error"] if len(body) < 65536 else {}
        why = f": {err.get('message')}" + (f" (param {err['param']})" if err.get("param") else "")
    except (ValueError, KeyError, TypeError):
        pass
    log.warning("%d %s %s%s%s", status, scope.get("method", "?"), scope.get("path", "?"), who, why[:500])


class BodyLimitMiddleware:
    """Pure ASGI: a request on any route (a GET, an unknown path) that announces a body over the
    limit (Content-Length) gets the 413 at once; the routes that read a body also count it as it
    arrives (``read_body``), for bodies sent without a length."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope.get("headers") or ():
                if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                    e = body_too_large(self.limit)
                    await JSONResponse(e.body(), status_code=e.status)(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def body_too_large(limit: int) -> ApiError:
    return ApiError(
        f"the request body is larger than the server's limit of {limit} bytes (--max-body-bytes)",
        None,
        "request_too_large",
        413,
    )


async def read_body(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The request body, read in chunks; an ApiError (413) as soon as it passes ``limit`` bytes
    (a Content-Length above it: before reading anything), a 415 unless it is JSON, a 408 if it
    is not all in within ``timeout_s`` (default BODY_TIMEOUT_S). ClientDisconnect passes through."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise body_too_large(limit)
    ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if ctype != "application/json" and not ctype.endswith("+json"):  # a page's cross-origin POST
        raise ApiError(  # cannot say application/json without a preflight (tinyllm/serve/guard.py)
            f"Content-Type must be application/json, got {f'{ctype!r}' if ctype else 'none'}: send the body as JSON",
            None,
            "unsupported_media_type",
            415,
        )
    coding = request.headers.get("content-encoding", "identity").strip().lower()
    if coding not in ("", "identity"):  # (a gzip body failed as "not valid JSON: can't decode byte 0x8b")
        raise ApiError(
            f"Content-Encoding {coding!r} is not supported: send the JSON body uncompressed",
            None,
            "unsupported_media_type",
            415,
        )
    chunks, size = [], 0
    timeout_s = BODY_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        async with asyncio.timeout(timeout_s):  # a body trickled in a byte at a time is cut
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise body_too_large(limit)
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(
            f"the request body did not arrive within {timeout_s:g} s ({size} bytes came)", None, "request_timeout", 408
        ) from None
    return b"".join(chunks)
