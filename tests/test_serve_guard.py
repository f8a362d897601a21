"""Who may reach `tinyllm serve` from where (tinyllm/serve/guard.py): a web page on another site
or a DNS-rebinding name cannot use a loopback server (403 naming the option that would allow it),
a text/plain POST (a page's CORS "simple request") is refused, and the options let them in."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers import SERVED_MODEL, serve_in_thread
from tinyllm.serve import EngineLoop, ServerThread, build_engine, create_app
from tinyllm.serve.guard import Exposure, host_name

ROUTES = [  # every route a page could use to act or to read
    ("POST", "/v1/completions", {"model": SERVED_MODEL, "prompt": "ROMEO:", "max_tokens": 2}),
    (
        "POST",
        "/v1/chat/completions",
        {"model": SERVED_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    ),
    ("POST", "/tokenize", {"prompt": "ROMEO:"}),
    ("POST", "/detokenize", {"tokens": [1, 2]}),
    ("POST", "/v1/tinyllm/abort", {"rid": 0}),
    ("GET", "/v1/tinyllm/stream", None),
    ("GET", "/v1/models", None),
]


@pytest.fixture(scope="module")
def server(model_tok):
    s = serve_in_thread(*model_tok, slots=2)
    yield s
    s.stop()


def call(server, method: str, path: str, body, **headers) -> httpx.Response:
    if path == "/v1/tinyllm/stream":  # a stream: its status, and a refusal's body (it ends)
        with httpx.stream(method, server.url + path, headers=headers, timeout=30) as r:
            if r.status_code >= 400:
                r.read()
            return r
    return httpx.request(method, server.url + path, json=body, headers=headers, timeout=30)


@pytest.mark.parametrize("method, path, body", ROUTES)
def test_a_foreign_origin_or_host_is_refused_on_every_route(server, method, path, body):
    r = call(server, method, path, body, origin="http://evil.example")
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    assert "--allowed-origins" in r.json()["error"]["message"]
    r = call(server, method, path, body, host="rebound.evil.example:8000")  # DNS rebinding
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
    assert "--allowed-hosts" in r.json()["error"]["message"]
    port = server.url.rsplit(":", 1)[1]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}"):  # loopback names, and its own origin
        ok = call(server, method, path, body, host=host, origin=f"http://{host}")
        assert ok.status_code != 403, (host, ok.text)


def test_probes_keep_answering_a_page_but_not_a_rebound_name(server):
    assert httpx.get(server.url + "/health", headers={"origin": "http://evil.example"}).status_code == 200
    assert httpx.get(server.url + "/health", headers={"host": "evil.example"}).status_code == 403


def test_a_text_plain_abort_is_refused_and_aborts_nothing(server):
    with httpx.stream("POST", server.url + "/v1/completions", timeout=30,
                      json={"model": SERVED_MODEL, "prompt": "ROMEO:", "max_tokens": 40, "stream": True}) as r:  # fmt: skip
        rid = int(r.headers["x-tinyllm-request-id"])
        page = httpx.post(server.url + "/v1/tinyllm/abort", content=f'{{"rid": {rid}}}', timeout=30,
                          headers={"content-type": "text/plain"})  # fmt: skip
        chunks = [line for line in r.iter_lines() if line.startswith("data: {")]
    assert page.status_code == 415 and page.json()["error"]["code"] == "unsupported_media_type"
    assert '"finish_reason":"length"' in chunks[-1]  # ran to its end: nothing was aborted


def test_what_a_request_did_not_send_is_said_as_missing_and_a_compressed_body_by_name(server):
    """No Content-Type read as the value 'none', an empty Host as '' (as if the client sent
    them); a gzip body failed as "not valid JSON: can't decode byte 0x8b"."""
    import gzip
    import json

    url, raw = server.url + "/v1/completions", json.dumps({"model": SERVED_MODEL, "prompt": "a", "max_tokens": 1})
    r = httpx.post(url, content=raw, timeout=30)  # no Content-Type
    assert r.status_code == 415 and "Content-Type must be application/json, got none:" in r.json()["error"]["message"]
    r = httpx.post(url, content=gzip.compress(raw.encode()), timeout=30,
                   headers={"content-type": "application/json", "content-encoding": "gzip"})  # fmt: skip
    err = r.json()["error"]
    assert r.status_code == 415 and err["message"].startswith("Content-Encoding 'gzip' is not supported")
    r = httpx.post(url, json=json.loads(raw), headers={"host": ""}, timeout=30)
    assert r.status_code == 403 and r.json()["error"]["message"].startswith("a request without a Host header is")


def test_the_options_let_named_hosts_and_origins_in(model_tok):
    model, tok = model_tok
    exposure = Exposure("127.0.0.1", ("Tinyllm.Lan",), ("http://notebook.example:8888",))
    s = ServerThread(create_app(EngineLoop(build_engine(model, slots=1)), tok, SERVED_MODEL, exposure=exposure)).start()
    try:
        body = {"prompt": "ROMEO:"}
        assert httpx.post(s.url + "/tokenize", json=body, headers={"host": "tinyllm.lan:80"}).status_code == 200
        ok = httpx.post(s.url + "/tokenize", json=body, headers={"origin": "http://notebook.example:8888"})
        assert ok.status_code == 200
        assert httpx.post(s.url + "/tokenize", json=body, headers={"origin": "http://other.example"}).status_code == 403
    finally:
        s.stop()


def test_hosts_on_a_public_address_and_the_host_names_read():
    assert Exposure("0.0.0.0").host_allowed("gpu-box.internal")  # it cannot know its public names
    assert not Exposure("0.0.0.0", ("gpu-box.internal",)).host_allowed("other")  # unless told them
    assert not Exposure("127.0.0.1").host_allowed("evil.example") and Exposure("::1").host_allowed("[::1]")
    assert [host_name(h) for h in ("LocalHost:80", "[::1]:8000", "[::1]", "127.0.0.1")] == [
        "localhost",
        "[::1]",
        "[::1]",
        "127.0.0.1",
    ]
