"""``tinyllm-tui --web``: the same app (race included) as a web page, for talks and classrooms.

textual-serve runs ``python -m tui.cli <the other options>`` once per browser tab, speaking to the
page over a websocket, so each tab gets its own app and its own engine process. Closing the tab
tells the app to quit, which stops its engine process (the engine process also stops by itself
when the app's end of its pipe closes); an app that does not quit within GRACE_S is killed with
its engine. The page and its websocket need the token printed in the URL at start (as Jupyter
does; $TINYLLM_WEB_TOKEN sets it) and refuse another site's Origin: anyone who can reach the port,
or a web page open in the user's browser, gets a 403 without it. Loopback by default; another
--host is the user's choice, and the server says so when it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import secrets
import shlex
import signal
import socket
import sys

DEFAULT_PORT = 8080
DEFAULT_SESSIONS = 4  # tabs served at once: each runs an app and an engine process (a model in memory)
WEB_ONLY = ("--host", "--port", "--web-sessions")


def port_number(s: str) -> int:
    from tinyllm.args import checked

    return checked(s, int, lambda v: 1 <= v <= 65535, "a port number in 1..65535")


def add_web_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--web",
        action="store_true",
        help="serve the app as a web page (textual-serve): one app and one engine process per browser tab",
    )
    p.add_argument(
        "--host",
        default=None,
        metavar="HOST",
        help="--web: the address to listen on (default 127.0.0.1: this machine only)",
    )
    p.add_argument(
        "--port", type=port_number, default=None, metavar="N", help=f"--web: the port (default {DEFAULT_PORT})"
    )
    p.add_argument(
        "--web-sessions",
        type=session_count,
        default=None,
        metavar="N",
        help=f"--web: browser tabs served at once, each with its own engine process (default {DEFAULT_SESSIONS}); "
        "a tab beyond them is told so and closed",
    )


def session_count(s: str) -> int:
    from tinyllm.args import checked

    return checked(s, int, lambda v: 1 <= v <= 64, "a number of sessions in 1..64")


def session_argv(argv: list[str]) -> list[str]:
    """The options each tab's app runs with: everything but --web, --host and --port."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--web":
            continue
        elif arg in WEB_ONLY:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in WEB_ONLY)):
            out.append(arg)
    return out


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_port(parser, host: str, port: int) -> None:
    """Say now, in one line, if the address cannot be listened on (in use, or not this machine's)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        parser.error(f"--host {host}: {e.strerror}")
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            parser.error(f"cannot listen on {host}:{port}: {e.strerror}")


def serve(parser, a, command: list[str]) -> int:
    """Serve ``command`` (the app with this tab's options) with textual-serve until Ctrl+C: one
    app and one engine process per browser tab. Checks the address first (one line, exit 2)."""
    host, port = a.host or "127.0.0.1", a.port or DEFAULT_PORT
    check_port(parser, host, port)
    try:
        import textual_serve.server  # noqa: F401 - present? (else the line below says what to install)
    except ImportError:
        parser.error("--web needs the textual-serve package: pip install textual-serve")
    if not is_loopback(host):
        print(
            f"tinyllm-tui --web: listening on {host}: anyone who can reach this machine there can open the app "
            f"(each tab starts an engine process)",
            file=sys.stderr,
        )
    from tinyllm.workload import bundled_workloads
    from tui.screens.picker import PICKER_ROOTS_ENV

    # F3 in a served app reads typed paths only from the bundled prompts and the working directory.
    prompts = {str(p.parent) for p in bundled_workloads().values()}
    os.environ[PICKER_ROOTS_ENV] = os.pathsep.join([*sorted(prompts), os.getcwd()])
    token = os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(18)
    capped_server(shlex.join(command), host, port, a.web_sessions or DEFAULT_SESSIONS, token).serve()
    return 0


GRACE_S = 3.0  # a tab's app, told to quit, gets this long before its processes are killed
TOKEN_ENV = "TINYLLM_WEB_TOKEN"  # the page's token, when a script must know it in advance
TOKEN_COOKIE = "tinyllm-web-token"


def capped_server(command: str, host: str, port: int, max_sessions: int, token: str | None = None):
    """textual-serve's Server, guarded (see ``WebGuard``): at most ``max_sessions`` tabs at once
    (each starts an app and an engine process, so an open page must not be a way to fill the
    machine: a tab beyond the cap gets one line in its terminal and is closed, nothing started);
    every page and websocket needs ``token`` (printed in the URL at start, as Jupyter does) and
    a same-origin request; a tab's app that does not quit within GRACE_S of its tab closing is
    killed with its engine process; SIGTERM or Ctrl+C ends everything within seconds."""
    import hmac
    import logging

    from aiohttp import web
    from textual_serve.server import Server

    log = logging.getLogger("tinyllm.web")
    ReapedAppService = _reaped_app_service()  # noqa: N806 - a class

    class GuardedServer(Server):
        live = 0

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.token = token
            self.sessions: set[ReapedAppService] = set()
            self.sockets: set[web.WebSocketResponse] = set()

        async def _make_app(self) -> web.Application:
            app = await super()._make_app()

            @web.middleware
            async def guard(request: web.Request, handler):
                if request.path.startswith("/static/"):  # the page's scripts and fonts: nothing of the user's
                    return await handler(request)
                origin = request.headers.get("Origin")
                if origin is not None and origin != f"{request.scheme}://{request.host}":
                    return web.Response(status=403, text=f"tinyllm-tui --web: Origin {origin} is not this page's\n")
                given = request.query.get("token") or request.cookies.get(TOKEN_COOKIE, "")
                if self.token is not None and not hmac.compare_digest(given.encode(), self.token.encode()):
                    return web.Response(
                        status=403, text="tinyllm-tui --web: open the address the server printed (it carries a token)\n"
                    )
                response = await handler(request)
                if request.path == "/" and self.token is not None:  # the page's websocket sends it back
                    response.set_cookie(TOKEN_COOKIE, self.token, httponly=True, samesite="Strict")
                return response

            app.middlewares.append(guard)
            app.on_shutdown.append(self._end_sessions)
            return app

        async def on_startup(self, app: web.Application) -> None:
            url = self.public_url + ("" if self.token is None else f"/?token={self.token}")
            self.console.print(f"tinyllm-tui --web: open {url}")
            self.console.print("[cyan]Press Ctrl+C to quit")

        async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
            if self.live >= max_sessions:
                ws = web.WebSocketResponse()
                await ws.prepare(request)
                await ws.send_bytes(refusal(max_sessions).encode())
                await ws.close()
                return ws
            self.live += 1
            websocket = web.WebSocketResponse(heartbeat=15, timeout=1.0)  # timeout: for a close's reply
            service = None
            self.sockets.add(websocket)
            try:
                await websocket.prepare(request)
                service = ReapedAppService(
                    self.command,
                    write_bytes=websocket.send_bytes,
                    write_str=websocket.send_str,
                    close=websocket.close,
                    download_manager=self.download_manager,
                    debug=self.debug,
                )
                self.sessions.add(service)
                await service.start(_int(request.query.get("width"), 80), _int(request.query.get("height"), 24))
                await self._process_messages(websocket, service)
            except asyncio.CancelledError:
                await websocket.close()
            except Exception as e:  # noqa: BLE001 - a bad message ends this tab, never the server
                log.warning("tinyllm-tui --web: a session ended: %s: %s", type(e).__name__, e)
            finally:
                self.sockets.discard(websocket)
                if service is None:
                    self.live -= 1
                else:  # (aiohttp cancels this handler once its client has gone: the clean-up is a
                    # task of its own, and the slot is free only once the tab's processes are)
                    cleanup = asyncio.ensure_future(service.stop_within(GRACE_S))
                    cleanup.add_done_callback(lambda _: self._ended(service))
                    await asyncio.shield(cleanup)
            return websocket

        def _ended(self, service) -> None:
            self.sessions.discard(service)
            self.live -= 1

        async def _end_sessions(self, app: web.Application) -> None:
            """Shutting down: every tab's app told to quit, and killed with its engine after GRACE_S;
            every tab's websocket closed meanwhile."""
            await asyncio.gather(
                *(s.stop_within(GRACE_S) for s in list(self.sessions)),
                *(s.close() for s in list(self.sockets)),
                return_exceptions=True,
            )

        def serve(self, debug: bool = False) -> None:
            """textual-serve's serve, with a shutdown that waits seconds, not a minute, for tabs."""
            self.debug = debug
            self.initialize_logging()
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.request_exit)
            web.run_app(
                self._make_app(),
                host=self.host,
                port=self.port,
                handle_signals=False,
                loop=loop,
                print=lambda *args: None,
                shutdown_timeout=GRACE_S,
            )

    return GuardedServer(command, host=host, port=port, title="tinyllm-tui")


def _int(text: str | None, default: int) -> int:
    try:
        return max(1, min(int(text or default), 1000))
    except ValueError:
        return default


def _reaped_app_service():
    from textual_serve.app_service import AppService

    class ReapedAppService(AppService):
        """A tab's app in a process group of its own, so the app and its engine process can be
        killed together; an empty keystroke packet (which made the app stop reading its input,
        so it never heard "quit" and kept its slot and engine) is never passed on."""

        async def _open_app_process(self, width: int = 80, height: int = 24):
            self._process = process = await asyncio.create_subprocess_shell(
                self.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._build_environment(width=width, height=height),
                start_new_session=True,
            )
            self._stdin = process.stdin
            return process

        async def send_bytes(self, data: bytes) -> bool:
            return True if not data else await super().send_bytes(data)

        async def stop_within(self, grace_s: float) -> None:
            """Ask the app to quit; past ``grace_s``, kill its process group (the engine too)."""
            try:
                await asyncio.wait_for(asyncio.shield(self.stop()), grace_s)
            except (TimeoutError, OSError, RuntimeError):
                pass
            process = self._process
            if process is not None and process.returncode is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                await process.wait()
            if self._task is not None:
                self._task.cancel()

    return ReapedAppService


def refusal(max_sessions: int) -> str:
    return (
        f"\r\n  tinyllm-tui --web: {max_sessions} session{'s' * (max_sessions != 1)} already open, the most this "
        f"server runs at once (--web-sessions). Close another tab and reload this one.\r\n"
    )
