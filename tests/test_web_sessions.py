"""tinyllm-tui --web serves at most --web-sessions tabs at once: each starts an app and an engine
process, so an open page must not be a way to fill the machine. A tab beyond the cap is told so
and closed, and nothing is started for it."""

import shlex
import sys

import pytest

from tui import web
from tui.cli import build_parser, parse


async def test_a_tab_beyond_the_cap_is_told_and_nothing_is_started_for_it():
    from aiohttp import WSMsgType
    from aiohttp.test_utils import TestClient, TestServer

    sleeper = shlex.join([sys.executable, "-c", "import time; time.sleep(30)"])  # stands in for the app
    server = web.capped_server(sleeper, "127.0.0.1", 0, max_sessions=1)
    client = TestClient(TestServer(await server._make_app()))
    await client.start_server()
    try:
        first = await client.ws_connect("/ws")
        await _until(lambda: server.live == 1)
        second = await client.ws_connect("/ws")
        msg = await second.receive(timeout=10)
        assert msg.type == WSMsgType.BINARY and b"1 session already open" in msg.data
        assert (await second.receive(timeout=10)).type in (WSMsgType.CLOSE, WSMsgType.CLOSED)
        assert server.live == 1
        await first.close()
        await _until(lambda: server.live == 0)
    finally:
        await client.close()


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
