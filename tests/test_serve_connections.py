"""Connection hygiene (tinyllm/serve/connections.py): silent and slow connections cannot take the
server down. More idle connections than the server's concurrency limit, from the same address as
the probes, and a few slow-header ones: /health and a completion still answer (not uvicorn's 503),
the silent ones over the per-client cap are closed at once and the rest, slow ones included, at
the header timeout; a body trickled in is cut with a 408."""

from __future__ import annotations

import select
import socket
import time

import httpx

from tests.helpers import SERVED_MODEL
from tinyllm.serve import EngineLoop, Limits, ServerThread, build_engine, create_app

LIMITS = Limits(limit_concurrency=24, header_timeout_s=1.0, idle_per_client=6)


def open_sockets(url: str, n: int) -> list[socket.socket]:
    host, port = url.removeprefix("http://").split(":")
    return [socket.create_connection((host, int(port)), timeout=10) for _ in range(n)]


def closed(s: socket.socket) -> bool:
    """The server closed it (reading gives end of file, or a reset), without waiting."""
    if not select.select([s], [], [], 0)[0]:
        return False
    try:
        return s.recv(1024) == b""
    except OSError:
        return True


def wait_until(what, backstop_s: float = 20.0) -> None:
    deadline = time.monotonic() + backstop_s
    while not what():
        assert time.monotonic() < deadline, "the server never did it"
        time.sleep(0.02)


def test_silent_and_slow_connections_are_cut_and_the_server_keeps_answering(model_tok):
    model, tok = model_tok
    app = create_app(EngineLoop(build_engine(model, slots=2)), tok, SERVED_MODEL, limits=LIMITS)
    server = ServerThread(app).start()
    try:
        silent = open_sockets(server.url, 40)  # more than limit_concurrency (24)
        slow = open_sockets(server.url, 3)
        for s in slow:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\n")  # and a byte now and then, never the end
        wait_until(lambda: sum(closed(s) for s in silent) >= 40 - LIMITS.idle_per_client)  # the oldest, at once
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200
        body = {"model": SERVED_MODEL, "prompt": "ROMEO:", "max_tokens": 4}
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=30).status_code == 200
        for _ in range(3):  # a byte now and then does not keep a header open past its timeout
            for s in slow:
                try:
                    s.sendall(b"x")
                except OSError:  # already cut at the header timeout (a busy machine gets here after it)
                    pass
            time.sleep(0.2)
        wait_until(lambda: all(closed(s) or s.fileno() == -1 for s in silent + slow))  # the header timeout
    finally:
        server.stop()


def test_a_body_trickled_in_is_cut_with_a_408(model_tok, monkeypatch):
    import tinyllm.serve.security as security

    monkeypatch.setattr(security, "BODY_TIMEOUT_S", 0.5)
    model, tok = model_tok
    server = ServerThread(create_app(EngineLoop(build_engine(model, slots=1)), tok, SERVED_MODEL)).start()
    try:
        (s,) = open_sockets(server.url, 1)
        s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\": ")  # fmt: skip
        s.settimeout(20)
        answer = b""
        while b"}}" not in answer and (more := s.recv(4096)):  # headers, then the JSON error
            answer += more
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.5 s" in answer
    finally:
        server.stop()
