"""tinyllm-tui --web serves at most --web-sessions tabs at once: each starts an app and an engine
process, so an open page must not be a way to fill the machine. A tab beyond the cap is told so
and closed, and nothing is started for it. The page and its websocket need the token the server
prints, and refuse another site's Origin; a tab's app that does not quit when its tab goes is
killed (its slot then serves another tab); SIGTERM ends the server and every tab's processes."""

import os
import shlex
import signal
import socket
import subprocess
import sys
import time

import pytest

from tui import web
from tui.cli import build_parser, parse


async def test_a_tab_beyond_the_cap_is_told_and_nothing_is_started_for_it():
    from aiohttp import WSMsgType
    from aiohttp.test_utils import TestClient, TestServer

    sleeper = shlex.join([sys.executable, "-c", "import time; time.sleep(30)"])  # stands in for the app
    server = web.capped_server(sleeper, "127.0.0.1", 0, max_sessions=1, token=TOKEN)
    client = TestClient(TestServer(await server._make_app()))
    await client.start_server()
    try:
        first = await client.ws_connect(f"/ws?token={TOKEN}")
        await _until(lambda: server.live == 1)
        second = await client.ws_connect(f"/ws?token={TOKEN}")
        msg = await second.receive(timeout=10)
        assert msg.type == WSMsgType.BINARY and b"1 session already open" in msg.data
        assert (await second.receive(timeout=10)).type in (WSMsgType.CLOSE, WSMsgType.CLOSED)
        assert server.live == 1
        await first.close()
        await _until(lambda: server.live == 0)
    finally:
        await client.close()


TOKEN = "the-printed-token"
# stands in for a tab's app that never quits: it says it is a Textual app, then ignores its input
WEDGED = shlex.join([sys.executable, "-c", "import time; print('__GANGLION__', flush=True); time.sleep(600)"])


async def test_the_page_and_its_websocket_need_the_token_and_this_pages_origin():
    from aiohttp import WSServerHandshakeError
    from aiohttp.test_utils import TestClient, TestServer

    server = web.capped_server(WEDGED, "127.0.0.1", 0, max_sessions=2, token=TOKEN)
    client = TestClient(TestServer(await server._make_app()))
    await client.start_server()
    try:
        for path, headers in (("/", {}), ("/?token=wrong", {}), ("/ws", {})):
            r = await client.get(path, headers=headers)
            assert r.status == 403 and "carries a token" in await r.text()
        page = await client.get(f"/?token={TOKEN}")
        assert page.status == 200 and page.cookies[web.TOKEN_COOKIE].value == TOKEN
        for attempt in ("/ws", f"/ws?token={TOKEN}"):  # a page on another site: refused either way
            try:
                await client.ws_connect(attempt, headers={"Origin": "http://evil.example"})
                raise AssertionError("a foreign Origin's websocket was accepted")
            except WSServerHandshakeError as e:
                assert e.status == 403
        assert server.live == 0  # nothing was started for them
    finally:
        await client.close()


async def test_a_wedged_tab_is_reaped_and_its_slot_serves_another(monkeypatch):
    """One websocket message ["stdin", ""] made the app stop reading input: it never heard its
    tab close, kept its slot and engine, and two such visits filled --web-sessions 2 for good."""
    from aiohttp.test_utils import TestClient, TestServer

    monkeypatch.setattr(web, "GRACE_S", 0.5)  # (the grace an app gets to quit: 3 s when served)

    server = web.capped_server(WEDGED, "127.0.0.1", 0, max_sessions=1, token=TOKEN)
    client = TestClient(TestServer(await server._make_app()))
    await client.start_server()
    try:
        ws = await client.ws_connect(f"/ws?token={TOKEN}")
        await _until(lambda: server.live == 1 and server.sessions)
        (service,) = server.sessions
        await ws.send_json(["stdin", ""])
        await ws.close()  # the tab goes; its app will not quit
        await _until(lambda: server.live == 0)
        assert service._process.returncode is not None  # killed, not left running
        again = await client.ws_connect(f"/ws?token={TOKEN}")
        await _until(lambda: server.live == 1)  # the slot serves the next tab
        await again.close()
        await _until(lambda: server.live == 0)
    finally:
        await client.close()


def test_sigterm_ends_the_server_and_every_tabs_processes():
    """Ctrl+C took about a minute and left the apps running, ignoring SIGTERM."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = f"from tui import web; web.capped_server({WEDGED!r}, '127.0.0.1', {port}, 2, token='t').serve()"
    server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        sock = _connect_when_listening(port)
        sock.sendall(
            b"GET /ws?token=t HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        assert sock.recv(4096).startswith(b"HTTP/1.1 101")
        app = _wait_for_child(server.pid)  # the tab's app (here: one that never quits)
        t0 = time.monotonic()
        server.send_signal(signal.SIGTERM)
        server.wait(60)
        took = time.monotonic() - t0
        assert server.returncode is not None and not _alive(app), took
        sock.close()
    finally:
        if server.poll() is None:
            server.kill()


def _connect_when_listening(port: int) -> socket.socket:
    for _ in range(600):
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError:
            time.sleep(0.05)
    raise AssertionError("the web server never listened")


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def _wait_for_child(pid: int) -> int:
    for _ in range(600):
        kids = _children(pid)
        if kids:
            return kids[0]
        time.sleep(0.05)
    raise AssertionError("no tab app started")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()[
        :1
    ] not in ("Z", "")


async def _until(check, timeout: float = 20.0) -> None:
    import asyncio

    for _ in range(int(timeout / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


def test_web_sessions_is_checked_and_belongs_to_web():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--web", "--web-sessions", "0"])
    a = parse(build_parser(), ["--web", "--web-sessions", "2"])
    assert a.web_sessions == 2
    assert web.session_argv(["--web", "--web-sessions", "2", "--slots", "4"]) == ["--slots", "4"]
