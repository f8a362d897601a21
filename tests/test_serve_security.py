"""`tinyllm serve` with an API key and its limits (issue 45): every route but /health and /metrics
needs the key, the observer routes included; a body too large, too many tokens to (de)tokenize
and a full waiting queue are each refused with a 4xx in OpenAI's shape naming the limit; a
non-loopback --host without a key warns; tinyllm-tui --attach sends the key and says when it
is refused.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.helpers import SERVED_MODEL
from tinyllm.serve import EngineLoop, Limits, ServerThread, build_engine, create_app
from tinyllm.serve.security import exposed_without_key_warning, is_loopback

KEY = "s3cret-key"
ADMIN = "operator-key"
LIMITS = Limits(max_body_bytes=4096, max_tokenize_tokens=50, max_waiting=2)
GUARDED = [
    ("GET", "/v1/models", None),
    ("POST", "/v1/completions", {"model": SERVED_MODEL, "prompt": "ROMEO:", "max_tokens": 2}),
    ("POST", "/v1/chat/completions", {"model": SERVED_MODEL, "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/tokenize", {"prompt": "ROMEO:"}),
    ("POST", "/detokenize", {"tokens": [1, 2]}),
    ("GET", "/v1/tinyllm/stream", None),
    ("POST", "/v1/tinyllm/abort", {"rid": 12345}),
    ("GET", "/v1/no-such-route", None),
]


@pytest.fixture(scope="module")
def server(model_tok):
    model, tok = model_tok
    app = create_app(
        EngineLoop(build_engine(model, slots=2)), tok, SERVED_MODEL, api_key=KEY, admin_key=ADMIN, limits=LIMITS
    )
    s = ServerThread(app).start()
    yield s
    s.stop()


def auth(key: str = KEY) -> dict:
    return {"Authorization": f"Bearer {key}"}


def is_error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code, err
    return err


# -- the key ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method, path, body", GUARDED)
def test_every_route_but_health_and_metrics_needs_the_key(server, method, path, body):
    for headers, says in [
        ({}, "didn't provide an API key"),
        (auth("wrong"), "Incorrect API key"),
        ({"Authorization": f"Basic {KEY}"}, "didn't provide an API key"),  # not a bearer token
        (auth(KEY + "x"), "Incorrect API key"),
    ]:
        r = httpx.request(method, server.url + path, json=body, headers=headers, timeout=30)
        err = is_error(r, 401, "invalid_api_key")
        assert says in err["message"] and err["type"] == "invalid_request_error"
        assert r.headers["www-authenticate"] == "Bearer" and KEY not in r.text


def test_health_and_metrics_stay_open(server):
    assert httpx.get(server.url + "/health", timeout=10).json() == {"status": "ok"}
    r = httpx.get(server.url + "/metrics", timeout=10)
    assert r.status_code == 200 and "vllm:num_requests_waiting" in r.text


def test_the_right_key_is_served_on_every_route(server):
    with httpx.Client(base_url=server.url, headers=auth(), timeout=60) as c:
        for path in ("/v1/tinyllm/abort", "/v1/tinyllm/stream"):  # the operator's routes: not the API key's
            r = c.request("POST" if path.endswith("abort") else "GET", path, json={"rid": 1})
            assert "needs the server's operator key" in is_error(r, 403, "admin_key_required")["message"]
    with httpx.Client(base_url=server.url, headers=auth(ADMIN), timeout=60) as c:  # the operator's: every route
        assert c.get("/v1/models").json()["data"][0]["id"] == SERVED_MODEL
        r = c.post("/v1/completions", json={"model": SERVED_MODEL, "prompt": "ROMEO:", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        assert c.post("/tokenize", json={"prompt": "ROMEO:"}).json()["count"] > 0
        assert c.post("/detokenize", json={"tokens": [1, 2]}).status_code == 200
        assert c.post("/v1/tinyllm/abort", json={"rid": 12345}).json() == {"rid": 12345, "aborted": False}
        with c.stream("GET", "/v1/tinyllm/stream") as s:  # the observer stream: its header
            assert s.status_code == 200 and '"model"' in next(s.iter_lines())


# -- limits -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize", "/v1/tinyllm/abort"])
def test_a_body_over_the_limit_is_refused_with_413(server, path):
    big = b'{"prompt": "' + b"a" * 5000 + b'"}'
    json_ = {**auth(ADMIN if "tinyllm" in path else KEY), "content-type": "application/json"}
    r = httpx.post(server.url + path, content=big, headers=json_, timeout=30)  # with Content-Length
    err = is_error(r, 413, "request_too_large")
    assert "4096 bytes" in err["message"] and "--max-body-bytes" in err["message"]

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(10):
            yield b" " * 1000

    r = httpx.post(server.url + path, content=chunks(), headers=json_, timeout=30)
    is_error(r, 413, "request_too_large")
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


@pytest.mark.parametrize("method, path", [("GET", "/v1/models"), ("GET", "/health"), ("POST", "/v1/nowhere")])
def test_any_route_announcing_a_body_over_the_limit_gets_413_at_once(server, method, path):
    r = httpx.request(method, server.url + path, content=b"x" * 5000, headers=auth(), timeout=30)
    is_error(r, 413, "request_too_large")


def test_tokenize_and_detokenize_take_a_bounded_number_of_tokens(server):
    with httpx.Client(base_url=server.url, headers=auth(), timeout=30) as c:
        err = is_error(c.post("/tokenize", json={"prompt": "ROMEO: " * 60}), 400, "too_many_tokens")
        assert "limit of 50 tokens" in err["message"] and err["param"] == "prompt"
        msgs = [{"role": "user", "content": "ROMEO: " * 60}]
        assert is_error(c.post("/tokenize", json={"messages": msgs}), 400, "too_many_tokens")["param"] == "messages"
        err = is_error(c.post("/detokenize", json={"tokens": [1] * 51}), 400, "too_many_tokens")
        assert "limit of 50" in err["message"] and err["param"] == "tokens"
        assert c.post("/detokenize", json={"tokens": [1] * 50}).status_code == 200


def test_a_full_waiting_queue_answers_429_with_retry_after_and_drops_nothing_admitted(server):
    """The engine thread is held (a call that blocks), so what is submitted waits: two are
    admitted (--max-waiting 2), the third is refused at once; once the engine runs, both
    admitted ones complete."""
    loop = server.engine_loop
    release, holding = threading.Event(), threading.Event()

    def hold(engine):
        holding.set()
        release.wait(30)

    loop.call_future(hold)
    assert holding.wait(30)
    results: list[httpx.Response] = []

    def send():
        body = {"model": SERVED_MODEL, "prompt": "ROMEO:", "max_tokens": 4}
        results.append(httpx.post(server.url + "/v1/completions", json=body, headers=auth(), timeout=60))

    threads = [threading.Thread(target=send) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while loop.waiting() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert loop.waiting() == 2
        body = {"model": SERVED_MODEL, "prompt": "JULIET:", "max_tokens": 4}
        t0 = time.monotonic()
        r = httpx.post(server.url + "/v1/completions", json=body, headers=auth(), timeout=30)
        assert time.monotonic() - t0 < 20  # at once, not after the queue drains (held up to 30 s)
        err = is_error(r, 429, "max_waiting_exceeded")
        assert "--max-waiting" in err["message"] and r.headers["retry-after"] == "1"
        r = httpx.post(server.url + "/v1/completions", json={**body, "n": 3}, headers=auth(), timeout=30)
        is_error(r, 429, "max_waiting_exceeded")  # n samples count n
    finally:
        release.set()
        for t in threads:
            t.join(60)
    assert [r.status_code for r in results] == [200, 200]
    assert all(r.json()["usage"]["completion_tokens"] == 4 for r in results)
    deadline = time.monotonic() + 10
    while loop.waiting() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loop.waiting() == 0


def test_uvicorn_gets_the_concurrency_limit(server):
    assert server.server.config.limit_concurrency == LIMITS.limit_concurrency == 1024


# -- the command line ---------------------------------------------------------------------------------
def test_loopback_hosts():
    assert all(is_loopback(h) for h in ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"])
    assert not any(is_loopback(h) for h in ["0.0.0.0", "::", "192.168.1.5", "example.com"])


def _serve_args(monkeypatch, capsys, argv: list[str]) -> tuple[dict, str]:
    """Run `tinyllm serve ARGV` up to the server (not started): what run_server got, and stderr."""
    import tinyllm.serve.server as server_mod
    from tinyllm.cli import main

    got: dict = {}

    def fake_run_server(engine, tok, name, sock, on_step=None, api_key=None, limits=None, **rest):
        got.update(api_key=api_key, limits=limits, **rest)
        sock.close()

    monkeypatch.setattr(server_mod, "run_server", fake_run_server)
    main(["serve", "--port", "0", "--device", "cpu", "--slots", "2", *argv])
    return got, capsys.readouterr().err


def test_cli_a_non_loopback_host_without_a_key_warns(monkeypatch, capsys):
    monkeypatch.delenv("TINYLLM_API_KEY", raising=False)
    got, err = _serve_args(monkeypatch, capsys, ["--host", "0.0.0.0"])
    assert got["api_key"] is None
    assert err == exposed_without_key_warning("0.0.0.0") + "\n" and "--api-key" in err
    got, err = _serve_args(monkeypatch, capsys, ["--host", "0.0.0.0", "--api-key", KEY])
    assert got["api_key"] == KEY and err == ""
    got, err = _serve_args(monkeypatch, capsys, [])  # loopback: no warning
    assert got["api_key"] is None and err == ""


def test_cli_takes_the_key_from_the_environment_and_the_limits(monkeypatch, capsys):
    monkeypatch.setenv("TINYLLM_API_KEY", "from-env")
    got, err = _serve_args(monkeypatch, capsys, ["--host", "0.0.0.0"])
    assert got["api_key"] == "from-env" and err == ""
    assert got["limits"] == Limits()
    got, _ = _serve_args(
        monkeypatch,
        capsys,
        [
            "--api-key",
            "flag",
            "--max-body-bytes",
            "100",
            "--max-tokenize-tokens",
            "7",
            "--max-waiting",
            "3",
            "--limit-concurrency",
            "9",
        ],
    )
    assert got["api_key"] == "flag" and got["limits"] == Limits(100, 7, 3, 9)
    monkeypatch.setenv("TINYLLM_ADMIN_KEY", "ops")
    got, _ = _serve_args(monkeypatch, capsys, ["--max-viewers", "2"])
    assert got["admin_key"] == "ops" and got["limits"].max_viewers == 2


# -- tinyllm-tui --attach --------------------------------------------------------------------------
def test_attach_sends_the_key_and_says_when_it_is_refused(server, monkeypatch, capsys):
    from tui.cli import build_app
    from tui.runners.attach import AttachRunner

    for env in ("TINYLLM_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(env, raising=False)
    with pytest.raises(ConnectionError, match=r"needs an API key \(401\)"):
        AttachRunner(server.url).start()
    with pytest.raises(ConnectionError, match=r"refused the API key \(401\)"):
        AttachRunner(server.url, api_key="wrong").start()
    with pytest.raises(ConnectionError, match=r"refused its stream \(403\): .*needs the server's operator key"):
        AttachRunner(server.url, api_key=KEY).start()  # a user's key does not show other users' prompts
    for runner in [AttachRunner(server.url, api_key=ADMIN)]:
        runner.start()
        assert runner.status == "ready" and runner.model_name == SERVED_MODEL
        runner.stop()
    for env in ("OPENAI_API_KEY", "TINYLLM_API_KEY"):  # the environment, TINYLLM_API_KEY first
        monkeypatch.setenv(env, ADMIN)
        runner = AttachRunner(server.url).start()
        assert runner.status == "ready"
        runner.stop()
    monkeypatch.setenv("OPENAI_API_KEY", "wrong")  # TINYLLM_API_KEY wins
    AttachRunner(server.url).start().stop()
    with pytest.raises(SystemExit) as e:  # the app: one line
        build_app(["--attach", server.url, "--wait", "0", "--api-key", "wrong"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refused the API key (401)" in err[0], err
    with pytest.raises(SystemExit) as e:  # without --attach: refused
        build_app(["--api-key", KEY])
    assert "--api-key applies to --attach" in capsys.readouterr().err


# -- overload ---------------------------------------------------------------------------------------
def test_overload_every_request_completes_or_is_refused_at_once_and_nothing_leaks(model_tok):
    """5x the clients the queue holds, at once, streaming and not, some hanging up after their
    first chunk: each one gets a whole answer or an immediate 429; afterwards nothing waits or
    runs and every KV block is free. (A short version of the issue's load test.) The engine is
    held between two steps until a client has been refused, so the clients overlap and fill the
    queue however fast the machine and however slowly they arrive (one that served them as fast
    as they came would refuse none); steps take 10 ms at least, so they overlap after it too."""
    model, tok = model_tok
    limits = Limits(max_waiting=4)
    loop = EngineLoop(build_engine(model, slots=2), on_step=lambda *_: time.sleep(0.01))
    app = create_app(loop, tok, SERVED_MODEL, limits=limits)
    clients = 5 * (limits.max_waiting + 2)
    outcomes: list[tuple[str, float]] = []
    lock = threading.Lock()
    go, refused = threading.Barrier(clients), threading.Event()

    def client(i: int, url: str) -> None:
        body = {"model": SERVED_MODEL, "prompt": f"ROMEO {i}:", "max_tokens": 12, "stream": i % 2 == 0}
        with httpx.Client(timeout=60) as c:
            go.wait(30)
            t0 = time.monotonic()
            with c.stream("POST", url + "/v1/completions", json=body) as r:
                outcome = answer(i, body, r)
            if outcome == "refused":
                refused.set()
        with lock:
            outcomes.append((outcome, time.monotonic() - t0))

    def answer(i: int, body: dict, r) -> str:
        if r.status_code == 429:
            r.read()
            assert r.headers["retry-after"] and r.json()["error"]["code"] == "max_waiting_exceeded"
            return "refused"
        assert r.status_code == 200, r.read()
        if not body["stream"]:
            r.read()
            assert r.json()["usage"]["completion_tokens"] == 12
            return "completed"
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        if i % 4 == 0:  # hang up after the first chunk
            return "hung up"
        rest = list(lines)
        assert rest[-2:] == ["data: [DONE]", ""] or rest[-1] == "data: [DONE]", rest[-3:]
        return "completed"

    with ServerThread(app) as s:
        release, holding = threading.Event(), threading.Event()
        s.engine_loop.call_future(lambda engine: (holding.set(), release.wait(60)))
        assert holding.wait(30), "the engine thread never took the hold"
        threads = [threading.Thread(target=client, args=(i, s.url)) for i in range(clients)]
        for t in threads:
            t.start()
        refused.wait(30)  # (a backstop: the assertion below says what went wrong)
        release.set()
        for t in threads:
            t.join(120)
        assert len(outcomes) == clients, outcomes  # (a client whose assert failed is missing)
        kinds = [k for k, _ in outcomes]
        assert kinds.count("refused") >= 1 and kinds.count("completed") >= 1, kinds
        assert all(dt < 10 for k, dt in outcomes if k == "refused")  # at once, not after a wait
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            load, held = s.engine_loop.call(lambda e: (e.load(), e.slots.allocated_tokens()))
            if load == (0, 0) and held == 0 and s.engine_loop.waiting() == 0:
                break
            time.sleep(0.05)
        assert load == (0, 0) and held == 0 and s.engine_loop.waiting() == 0, (load, held)


# -- client-chosen work: bounded before it starts ------------------------------------------------------
def test_a_body_of_too_many_arrays_or_objects_is_refused_before_it_is_parsed(model_tok):
    """A 1 MiB [[],[],...] took 2.7 s of the event loop (parse and depth walk), 30k chat messages
    4.4 s for 8 bodies; brackets inside strings are text and count for nothing."""
    from tinyllm.serve.body import MAX_JSON_CONTAINERS, ApiError, load_json

    nested = b'{"prompt": [' + b"[]," * 300_000 + b"[]]}"
    chat = json.dumps({"messages": [{"role": "user", "content": 'x\\"[{'}] * 30_000}).encode()
    for raw, n in ((nested, 300_003), (chat, 30_002)):
        with pytest.raises(ApiError, match=f"holds {n} arrays/objects, more than the {MAX_JSON_CONTAINERS}"):
            load_json(raw)
    code = {"prompt": '[{"a": [1]}] \\" ' * 20_000}  # a prompt full of brackets, as text
    assert load_json(json.dumps(code).encode()) == code


def test_tokenize_refuses_a_text_too_long_for_its_limit_without_tokenizing(server, monkeypatch, model_tok):
    _, tok = model_tok
    from tinyllm.serve.security import TOKENIZE_CHARS_PER_TOKEN

    most = LIMITS.max_tokenize_tokens * TOKENIZE_CHARS_PER_TOKEN
    calls = []
    monkeypatch.setattr(type(tok), "encode", lambda self, *a, **k: calls.append(a) or [])
    r = httpx.post(server.url + "/tokenize", json={"prompt": "a" * (most + 1)}, headers=auth(), timeout=30)
    err = is_error(r, 400, "too_many_tokens")
    assert "refused without tokenizing" in err["message"] and err["param"] == "prompt" and calls == []
    monkeypatch.undo()
    r = httpx.post(server.url + "/tokenize", json={"prompt": "a" * most}, headers=auth(), timeout=30)
    assert "more than the server's limit of 50 tokens" in is_error(r, 400, "too_many_tokens")["message"]  # counted


# -- smaller holes (issue 57) ------------------------------------------------------------------------------
def test_n_above_max_waiting_is_a_400_not_a_429_a_client_would_retry_forever(server):
    body = {"model": SERVED_MODEL, "prompt": "ROMEO:", "max_tokens": 2, "n": LIMITS.max_waiting + 1}
    err = is_error(
        httpx.post(server.url + "/v1/completions", json=body, headers=auth(), timeout=30), 400, "invalid_value"
    )
    assert err["param"] == "n" and "--max-waiting" in err["message"]


def test_a_lone_surrogate_in_stop_is_a_400(server):
    raw = '{"model": "' + SERVED_MODEL + '", "prompt": "ROMEO:", "stop": ["a", "\\udfff"]}'
    r = httpx.post(server.url + "/v1/completions", content=raw, timeout=30,
                   headers={**auth(), "content-type": "application/json"})  # fmt: skip
    assert is_error(r, 400, "invalid_value")["param"] == "stop[1]"


def test_a_lone_surrogate_in_a_fields_name_is_a_400_and_the_connection_goes_on(server):
    """The error quoted the name back and could not be encoded: a 500, and uvicorn dropped the
    client's keep-alive connection, so its next request failed too."""
    with httpx.Client(base_url=server.url, headers={**auth(), "content-type": "application/json"}, timeout=30) as c:
        for route, body in (("/v1/completions", '"prompt": "a"'), ("/v1/chat/completions", '"messages": []')):
            raw = "{" + body + ', "max_token\\ud800": 1}'
            err = is_error(c.post(route, content=raw), 400, "unrecognized_parameter")
            assert err["param"] == "max_token\\ud800" and "max_token" in err["message"]
        r = c.post("/v1/completions", json={"model": SERVED_MODEL, "prompt": "ROMEO:", "max_tokens": 2})
        assert r.status_code == 200  # the same connection, still served


def test_a_prompt_holding_a_line_separator_keeps_every_viewers_stream_one_record_a_line(server):
    """U+0085, U+2028 and U+2029 went out unescaped in the state stream, and httpx's iter_lines
    (the app's reader) breaks lines at them: one client's prompt broke every viewer's stream."""
    prompt = "a\u0085b\u2028c\u2029d"
    r = httpx.post(server.url + "/v1/completions", json={"model": SERVED_MODEL, "prompt": prompt, "max_tokens": 2},
                   headers=auth(), timeout=30)  # fmt: skip
    assert r.status_code == 200
    with httpx.stream("GET", server.url + "/v1/tinyllm/stream", headers=auth(ADMIN), timeout=30) as s:
        lines = s.iter_lines()
        header, first = json.loads(next(lines)), json.loads(next(lines))  # (a split line does not parse)
    assert header and prompt in json.dumps(first, ensure_ascii=False)


def test_keys_no_client_could_send_are_refused_and_a_utf8_key_matches(monkeypatch, model_tok):
    from tinyllm.serve.security import api_key_from_env

    monkeypatch.setenv("TINYLLM_API_KEY", "from-env")
    with pytest.raises(ValueError, match="--api-key is empty"):
        api_key_from_env("")  # it silently turned the environment's key off
    with pytest.raises(ValueError, match="spaces or control characters"):
        api_key_from_env(" padded ")  # it could never match
    assert api_key_from_env(None) == "from-env"
    model, tok = model_tok
    key = "clé-ünïcode"
    app = create_app(EngineLoop(build_engine(model, slots=1)), tok, SERVED_MODEL, api_key=key)
    s = ServerThread(app).start()
    try:
        ok = httpx.get(s.url + "/v1/models", headers={"authorization": b"Bearer " + key.encode("utf-8")})
        latin = httpx.get(s.url + "/v1/models", headers={"authorization": b"Bearer " + key.encode("latin-1")})
        assert (ok.status_code, latin.status_code) == (200, 401)
    finally:
        s.stop()


# -- the operator's key (issue 57 item 6) ------------------------------------------------------------------
def test_without_an_operator_key_an_api_key_never_reads_others_prompts(model_tok):
    model, tok = model_tok
    s = ServerThread(create_app(EngineLoop(build_engine(model, slots=1)), tok, SERVED_MODEL, api_key=KEY)).start()
    try:
        with httpx.Client(base_url=s.url, headers=auth(), timeout=30) as c:
            for method, path in (("GET", "/v1/tinyllm/stream"), ("POST", "/v1/tinyllm/abort")):
                err = is_error(c.request(method, path, json={"rid": 0}), 403, "admin_key_required")
                assert "start it with --admin-key KEY" in err["message"]
            assert c.post("/tokenize", json={"prompt": "ROMEO:"}).status_code == 200  # the rest: served
    finally:
        s.stop()


def test_an_aborted_requests_client_gets_its_text_and_finish_reason_abort(server):
    """It got a 500 ("aborted by an operator") though nothing failed."""
    body = {"model": SERVED_MODEL, "prompt": "ROMEO:", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=auth(), timeout=60) as r:
        rid = int(r.headers["x-tinyllm-request-id"])
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: {"))
        ok = httpx.post(server.url + "/v1/tinyllm/abort", json={"rid": rid}, headers=auth(ADMIN), timeout=30)
        rest = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    assert ok.json() == {"rid": rid, "aborted": True} and first
    assert rest[-1]["choices"][0]["finish_reason"] == "abort" and "error" not in rest[-1]


def test_viewers_are_capped(model_tok):
    """50 viewers doubled a completion's latency (each costs the engine thread a snapshot per step)."""
    import asyncio

    model, tok = model_tok
    app = create_app(EngineLoop(build_engine(model, slots=1)), tok, SERVED_MODEL, limits=Limits(max_viewers=2))
    s = ServerThread(app).start()
    try:
        loop = asyncio.new_event_loop()
        for _ in range(2):  # two viewers watching
            s.engine_loop.call(lambda eng: app.state.feed.subscribe(eng, loop))
        r = httpx.get(s.url + "/v1/tinyllm/stream", timeout=30)
        err = is_error(r, 429, "too_many_viewers")
        assert "--max-viewers 2" in err["message"] and r.headers["retry-after"] == "5"
        loop.close()
    finally:
        s.stop()
