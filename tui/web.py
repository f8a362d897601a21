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
import shlex
import socket
import sys

DEFAULT_PORT = 8080
WEB_ONLY = ("--host", "--port")


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
        from textual_serve.server import Server
    except ImportError:
        parser.error("--web needs the textual-serve package: pip install textual-serve")
    if not is_loopback(host):
        print(
            f"tinyllm-tui --web: listening on {host}: anyone who can reach this machine there can open the app "
            f"(each tab starts an engine process)",
            file=sys.stderr,
        )
    Server(shlex.join(command), host=host, port=port, title="tinyllm-tui").serve()
    return 0
