"""Who may reach the server from where: Host and Origin checks, and JSON bodies only.

A server on loopback is still reachable from every web page the user opens: a page can POST a
"simple" cross-origin request (``Content-Type: text/plain``, no CORS preflight) to
``127.0.0.1:8000`` and abort every request or burn compute, and through DNS rebinding (a name
the attacker controls, re-pointed at 127.0.0.1) read ``/v1/tinyllm/stream``, which carries every
prompt. So, the way Jupyter guards its loopback server:

- **Host**: a server bound to loopback answers only requests addressed to a loopback name
  (``localhost``, ``127.0.0.1``, ``[::1]``) or its bound address; a rebinding page's requests
  carry the attacker's name and get a 403. Bound to another address, any Host is taken unless
  ``--allowed-hosts`` lists them. ``--allowed-hosts NAME,...`` adds names (``*``: any).
- **Origin**: a request a browser sends from a page carries its ``Origin``; one that is not the
  server's own (scheme://Host) nor in ``--allowed-origins`` (``*``: any) gets a 403. Programs
  (curl, the OpenAI client, vLLM's benchmark) send no Origin and pass.
- **JSON only**: a route that reads a body takes it only as ``Content-Type: application/json``
  (``read_body``, tinyllm/serve/security.py: a 415 otherwise), which a page cannot send
  cross-origin without a preflight this server never grants.

``/health`` and ``/metrics`` are exempt from the Origin check (probes), not from the Host check.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from tinyllm.serve.body import error_body
from tinyllm.serve.security import OPEN_PATHS, is_loopback

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


@dataclass(frozen=True)
class Exposure:
    """Where the server listens and whom else it lets in (see the module docstring)."""

    bind_host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()  # names beyond the defaults; "*": any
    allowed_origins: tuple[str, ...] = ()  # web origins (scheme://host[:port]); "*": any

    def host_allowed(self, host: str) -> bool:
        """``host``: the Host header's name, without its port, lower-case."""
        listed = {h.lower() for h in self.allowed_hosts}
        if "*" in listed or host in listed:
            return True
        if is_loopback(self.bind_host):
            return host in LOOPBACK_NAMES or host == self.bind_host.lower()
        return not self.allowed_hosts  # bound to a public address: any Host, unless listed

    def origin_allowed(self, origin: str, host_header: str, scheme: str) -> bool:
        if "*" in self.allowed_origins or origin in self.allowed_origins:
            return True
        return origin == f"{scheme}://{host_header}"  # the server's own pages


def host_name(host_header: str) -> str:
    """The Host header's name without its port (``[::1]:8000`` -> ``[::1]``), lower-case."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[: h.index("]") + 1] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers") or ():
        if k == name:
            return v.decode("latin-1")
    return None


class GuardMiddleware:
    """Pure ASGI: the Host and Origin checks above, each refusal a 403 in OpenAI's error shape
    naming the option that would allow it (a websocket: closed, code 1008)."""

    def __init__(self, app: ASGIApp, exposure: Exposure):
        self.app, self.exposure = app, exposure

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, message, code = refusal
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await JSONResponse(error_body(message, "invalid_request_error", None, code), status_code=status)(
            scope, receive, send
        )

    def refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        ex = self.exposure
        host_header = _header(scope, b"host") or ""
        host = host_name(host_header)
        if not ex.host_allowed(host):
            return (
                403,
                f"{f'Host {host_header!r} is' if host_header else 'a request without a Host header is'} not this "
                f"server's: it answers requests addressed to "
                f"{'a loopback name' if is_loopback(ex.bind_host) else 'the names in --allowed-hosts'}; "
                "start it with --allowed-hosts NAME to take this one",
                "host_not_allowed",
            )
        if scope.get("path") in OPEN_PATHS:
            return None
        origin = _header(scope, b"origin")
        if origin is not None and not ex.origin_allowed(
            origin.strip(), host_header.strip(), scope.get("scheme", "http")
        ):
            return (
                403,
                f"Origin {origin!r} is not allowed: a web page from another site may not use this server; "
                "start it with --allowed-origins ORIGIN to let that page in",
                "origin_not_allowed",
            )
        return None
