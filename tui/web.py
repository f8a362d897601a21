"""``tinyllm-tui --web``: the same app (race included) as a web page, for talks and classrooms.

textual-serve runs ``python -m tui.cli <the other options>`` once per browser tab, speaking to the
page over a websocket, so each tab gets its own app and its own engine process. Closing the tab
tells the app to quit, which stops its engine process (the engine process also stops by itself
when the app's end of its pipe closes). Loopback by default; another --host is the user's choice,
and the server says so when it starts.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shlex
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
    capped_server(shlex.join(command), host, port, a.web_sessions or DEFAULT_SESSIONS).serve()
    return 0


def capped_server(command: str, host: str, port: int, max_sessions: int):
    """textual-serve's Server, serving at most ``max_sessions`` tabs at once: each tab starts an
    app and an engine process, so an open page must not be a way to fill the machine. A tab
    beyond the cap gets one line in its terminal and is closed; nothing is started for it."""
    from aiohttp import web
    from textual_serve.server import Server

    class CappedServer(Server):
        live = 0

        async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
            if self.live >= max_sessions:
                ws = web.WebSocketResponse()
                await ws.prepare(request)
                await ws.send_bytes(refusal(max_sessions).encode())
                await ws.close()
                return ws
            self.live += 1
            try:
                return await super().handle_websocket(request)
            finally:
                self.live -= 1

    return CappedServer(command, host=host, port=port, title="tinyllm-tui")


def refusal(max_sessions: int) -> str:
    return (
        f"\r\n  tinyllm-tui --web: {max_sessions} session{'s' * (max_sessions != 1)} already open, the most this "
        f"server runs at once (--web-sessions). Close another tab and reload this one.\r\n"
    )
