"""`tinyllm serve`: the OpenAI-compatible server over the engine, through real HTTP.

One uvicorn server (bundled model, paged KV + chunked prefill + prefix cache) runs in a thread
of this process for the whole module, so the tests can also reach its engine (through the
engine loop, in the engine's own thread) and check that nothing leaks. Greedy outputs are
compared with solo ``generate()``, the engine's reference.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import SERVED_MODEL, check_invariants, cli_refusal, engine_held, random_model, serve_in_thread
from tinyllm.engine import ContinuousEngine, Request
from tinyllm.engine.solo import generate
from tinyllm.model.tokenizer import Tokenizer
from tinyllm.serve import EngineLoop, RequestFailed, RequestRejected, ServerThread, build_engine, create_app
from tinyllm.serve.protocol import DEFAULT_MAX_TOKENS
from tinyllm.serve.tokenization import max_token_bytes

MODEL = SERVED_MODEL
SLOTS = 8
PROMPTS = [
    "ROMEO:\n",
    "JULIET:\n",
    "HAMLET:\nTo be, or not",
    "KING LEAR:\nBlow, winds",
    "PROSPERO:\n",
    "MACBETH:\nIs this a dagger",
    "First Citizen:\nBefore we proceed",
    "OTHELLO:\n",
    "PORTIA:\nThe quality",
    "BRUTUS:\n",
    "Enter the Duke.",
    "What light through yonder",
    "Now is the winter",
    "FALSTAFF:\n",
    "All the world's a stage",
    "CORDELIA:\n",
]
LONG_PROMPT = (
    "GLOUCESTER:\nNow is the winter of our discontent made glorious summer by this sun of York; and all "
    "the clouds that lour'd upon our house in the deep bosom of the ocean buried."
)
TIMEOUT = httpx.Timeout(60.0)


# -- fixtures -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(model_tok):
    s = serve_in_thread(*model_tok, slots=SLOTS)
    yield s
    t0 = time.monotonic()
    s.stop()
    assert not s.engine_loop.thread.is_alive() and time.monotonic() - t0 < 10


@pytest.fixture
def slow_server(model_tok):
    """The module server's engine, with steps of 10 ms at least: a 400-token request runs 4 s or
    more however fast the machine, so a client can hang up on it while it runs."""
    model, tok = model_tok
    loop = EngineLoop(build_engine(model, slots=SLOTS), on_step=lambda *_: time.sleep(0.01))
    s = ServerThread(create_app(loop, tok, MODEL)).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def solo(model_tok):
    """Solo greedy generate() with the tokenizer's EOS, memoized by (prompt, max_tokens)."""
    model, tok = model_tok
    memo: dict = {}

    def run(prompt: str | list[int], n: int) -> list[int]:
        key = (prompt if isinstance(prompt, str) else tuple(prompt), n)
        if key not in memo:
            ids = tok.encode(prompt) if isinstance(prompt, str) else list(prompt)
            memo[key] = generate(model, ids, n, eos_id=tok.eos_id)
        return memo[key]

    return run


def engine_call(server, fn):
    return server.engine_loop.call(fn, timeout=30)


def wait_idle(server, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not engine_call(server, lambda e: e.has_work()):
            return
        time.sleep(0.05)
    raise AssertionError(f"the engine still has work after {timeout} s")


def assert_nothing_held(server) -> None:
    """No request queued or running, no KV block claimed, every paged-cache invariant holds."""

    def check(e):
        check_invariants(e)
        return e.snapshot()

    snap = engine_call(server, check)
    assert snap.num_requests_running == 0 and snap.num_requests_waiting == 0
    assert snap.kv.allocated_tokens == 0 and snap.kv.free_blocks == snap.kv.n_blocks
    assert all(s.free for s in snap.slots)
    assert all(v.state in ("finished", "aborted") for v in snap.requests)


def sse_events(lines) -> list:
    """The data payloads of an SSE body (``[DONE]`` kept as a string)."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
        else:
            assert line == "", f"unexpected SSE line {line!r}"
    return out


def metrics(client) -> dict:
    """{(sample name, frozenset(labels)): value}, parsed by prometheus_client."""
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(r.text)
        for s in fam.samples
    }


def metric(m: dict, name: str, **labels) -> float:
    return m[(name, frozenset({"model_name": MODEL, **labels}.items()))]


def complete(client, **body) -> dict:
    r = client.post("/v1/completions", json={"model": MODEL, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


# -- routes -------------------------------------------------------------------------------------
def test_models_and_health(client, server):
    assert client.get("/health").json() == {"status": "ok"}
    data = client.get("/v1/models").json()
    assert data["object"] == "list" and [m["id"] for m in data["data"]] == [MODEL]
    assert data["data"][0]["max_model_len"] == engine_call(server, lambda e: e.max_len)


def test_completion_equals_solo_generate(client, model_tok, solo):
    _, tok = model_tok
    for prompt in PROMPTS[:3]:
        want = solo(prompt, 12)
        out = complete(client, prompt=prompt, max_tokens=12, return_token_ids=True)
        choice = out["choices"][0]
        assert choice["token_ids"] == want and choice["prompt_token_ids"] == tok.encode(prompt)
        assert choice["text"] == tok.decode(want, skip_special_tokens=True)
        assert choice["finish_reason"] == ("stop" if want[-1] == tok.eos_id else "length")
        assert out["object"] == "text_completion" and out["model"] == MODEL and out["id"].startswith("cmpl-")
        n, u = len(tok.encode(prompt)), out["usage"]
        assert (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]) == (n, len(want), n + len(want))
        assert u["prompt_tokens_details"] == {"cached_tokens": 0}  # short prompts: no full block to reuse
    plain = complete(client, prompt=PROMPTS[0])  # defaults: 16 tokens, no token ids
    assert "token_ids" not in plain["choices"][0] and plain["usage"]["completion_tokens"] == DEFAULT_MAX_TOKENS
    assert plain["choices"][0]["text"] == tok.decode(solo(PROMPTS[0], DEFAULT_MAX_TOKENS), skip_special_tokens=True)


def test_streaming_equals_solo_generate(client, model_tok, solo):
    _, tok = model_tok
    prompt, want = PROMPTS[3], solo(PROMPTS[3], 10)
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 10,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    *chunks, usage = events[:-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(want)
    assert usage["usage"]["prompt_tokens"] == len(tok.encode(prompt))
    assert all(c["usage"] is None and len(c["choices"]) == 1 and c["id"] == usage["id"] for c in chunks)
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == want
    assert "".join(c["choices"][0]["text"] for c in chunks) == tok.decode(want, skip_special_tokens=True)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    with client.stream(
        "POST",
        "/v1/completions",
        json={"model": MODEL, "prompt": prompt, "max_tokens": 10, "temperature": 0, "stream": True},
    ) as r:
        plain = sse_events(r.iter_lines())  # no usage asked: no usage key, no usage chunk
    assert plain[-1] == "[DONE]" and all("usage" not in c and len(c["choices"]) == 1 for c in plain[:-1])
    assert "".join(c["choices"][0]["text"] for c in plain[:-1]) == tok.decode(want, skip_special_tokens=True)


def test_token_id_prompts(client, model_tok, solo):
    _, tok = model_tok
    ids = tok.encode(PROMPTS[4])
    want = solo(PROMPTS[4], 8)
    for prompt in (ids, [ids], [PROMPTS[4]]):  # ids, a batch of one ids, a batch of one text
        out = complete(client, prompt=prompt, max_tokens=8, return_token_ids=True)
        assert out["choices"][0]["token_ids"] == want and out["usage"]["prompt_tokens"] == len(ids)


def test_finish_reason_stop_at_eos(model_tok, solo):
    """A tokenizer whose EOS is a token the model really produces part-way: the engine stops
    there and the server says "stop"; ignore_eos runs on to max_tokens ("length")."""
    model, tok = model_tok
    want = solo(PROMPTS[5], 10)
    stop_at = next(i for i in range(2, 9) if want[i] not in want[:i])  # its first occurrence
    eos = want[stop_at]
    want = want[: stop_at + 1]
    tok2 = Tokenizer(tok.hf, eos_id=eos)
    app = create_app(EngineLoop(build_engine(model, slots=2)), tok2, MODEL)
    with ServerThread(app) as s, httpx.Client(base_url=s.url, timeout=TIMEOUT) as c:
        out = complete(c, prompt=PROMPTS[5], max_tokens=10, return_token_ids=True)
        assert out["choices"][0]["token_ids"] == want and out["choices"][0]["finish_reason"] == "stop"
        assert out["usage"]["completion_tokens"] == len(want) < 10
        with c.stream(
            "POST", "/v1/completions", json={"prompt": PROMPTS[5], "max_tokens": 10, "temperature": 0, "stream": True}
        ) as r:
            chunks = sse_events(r.iter_lines())[:-1]
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        assert "".join(ch["choices"][0]["text"] for ch in chunks) == tok.decode(want, skip_special_tokens=True)
        out = complete(c, prompt=PROMPTS[5], max_tokens=10, ignore_eos=True, return_token_ids=True)
        assert out["choices"][0]["token_ids"] == generate(model, tok.encode(PROMPTS[5]), 10)
        assert out["choices"][0]["finish_reason"] == "length"
        m = metrics(c)
        assert metric(m, "vllm:request_success_total", finished_reason="stop") == 2
        assert metric(m, "vllm:request_success_total", finished_reason="length") == 1


def test_cached_tokens_for_a_repeated_prompt(client, server, model_tok, solo):
    _, tok = model_tok
    ids = tok.encode(LONG_PROMPT)
    assert len(ids) >= 40
    first = complete(client, prompt=LONG_PROMPT, max_tokens=4, return_token_ids=True)
    second = complete(client, prompt=LONG_PROMPT, max_tokens=4, return_token_ids=True)
    assert first["choices"][0]["token_ids"] == second["choices"][0]["token_ids"] == solo(LONG_PROMPT, 4)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    block = engine_call(server, lambda e: e.slots.block_size)
    assert 0 < cached < len(ids) and cached % block == 0
    views = [v for v in engine_call(server, lambda e: e.snapshot()).requests if v.prompt == tuple(ids)]
    assert [v.cached_tokens for v in views[-2:]] == [0, cached]  # what the engine's RequestView says


def test_metrics(client, server, model_tok):
    _, tok = model_tok
    before = metrics(client)
    outs = [complete(client, prompt=p, max_tokens=6) for p in PROMPTS[6:8]]
    after = metrics(client)

    def delta(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    prompt_toks = sum(o["usage"]["prompt_tokens"] for o in outs)
    gen_toks = sum(o["usage"]["completion_tokens"] for o in outs)
    assert delta("vllm:prompt_tokens_total") == prompt_toks
    assert delta("vllm:generation_tokens_total") == gen_toks
    assert delta("vllm:request_success_total", finished_reason="length") == 2
    assert delta("vllm:request_success_total", finished_reason="abort") == 0
    for h in (
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
    ):
        assert delta(h + "_count") == 2 and delta(h + "_sum") >= 0
        assert metric(after, h + "_bucket", le="+Inf") == metric(after, h + "_count")
    assert delta("vllm:inter_token_latency_seconds_count") == gen_toks - 2
    assert metric(after, "vllm:num_requests_running") == 0 and metric(after, "vllm:num_requests_waiting") == 0
    assert metric(after, "vllm:kv_cache_usage_perc") == 0
    assert metric(after, "vllm:num_preemptions_total") == 0
    counters = engine_call(server, lambda e: e.snapshot().counters)
    assert metric(after, "vllm:prefix_cache_queries_total") == counters.prefix_queries > 0
    assert metric(after, "vllm:prefix_cache_hits_total") == counters.prefix_hits
    n_blocks, block = engine_call(server, lambda e: (e.slots.n_blocks, e.slots.block_size))
    info = [k for k in after if k[0] == "vllm:cache_config_info"]
    assert len(info) == 1 and after[info[0]] == 1
    labels = dict(info[0][1])
    assert (labels["block_size"], labels["num_gpu_blocks"], labels["model_name"]) == (str(block), str(n_blocks), MODEL)
    assert labels["cache_dtype"] == "auto"  # as configured, vLLM's way


# -- bad requests ---------------------------------------------------------------------------------
BAD_VALUES = {  # a parameter: values it refuses beside a good prompt, each named in the error
    "model": ["gpt-4", 3],
    "max_tokens": [0, "8", 2.5],
    "temperature": [-0.5, "hot"],
    "top_p": [0, 1.5],
    "top_k": [-3, 2.5],
    "stream": ["yes"],
    "stream_options": [{"include_usage": True}],  # without stream
    "n": [0, 17, "x", 2.5],  # (2.0 is 2, as vLLM takes it)
    "best_of": [2],
    "echo": ["yes", 1],
    # issue 24's fields: each out-of-range or mistyped value names its parameter
    "seed": [2**63, "7", 1.5],
    "min_p": [1.5, "0.1"],
    "presence_penalty": [2.5],
    "frequency_penalty": [-2.01],
    "repetition_penalty": [0, -1],
    "stop": [3, ["a", 3], ["s"] * 17],
    "stop_token_ids": [[-1], 5, [4096]],  # [4096]: outside the vocabulary
    "min_tokens": [17, -1],  # 17: more than max_tokens (16)
    "logprobs": [21, True, -1],
}
BAD = [  # (body, param)
    (b"{not json", None),
    (b"\xff\xfe", None),
    (b"[1, 2]", None),
    ({"model": MODEL}, "prompt"),
    *[({"prompt": p}, "prompt") for p in (12, ["two", "prompts"], [[1, 2], [3]], "", [], [1, -2], [1, True])],
    ({"prompt": [1, 4096]}, "prompt"),  # outside the vocabulary
    ({"prompt": [1] * 500, "max_tokens": 16}, "max_tokens"),  # 516 > the 512-token context: the prompt fits
    ({"prompt": [1] * 512, "max_tokens": 1}, "prompt"),  # the prompt alone does not
    ({"prompt": "x", "stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
    *[({"prompt": "x", param: v}, param) for param, values in BAD_VALUES.items() for v in values],
]


def test_bad_requests_get_400_and_the_server_goes_on(client, solo):
    for body, param in BAD:
        kw = {"content": body} if isinstance(body, bytes) else {"json": body}
        r = client.post("/v1/completions", headers={"content-type": "application/json"}, **kw)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], (body, err)
        assert err["type"] == "invalid_request_error" and err["param"] == param, (body, err)
        assert not re.search(r"\b(None|True|False)\b", err["message"]), err  # JSON's words, not Python's
    for method, path, status in (
        ("GET", "/v1/nope", 404),
        ("POST", "/v2/completions", 404),
        ("GET", "/v1/completions", 405),
    ):
        r = client.request(method, path)
        assert r.status_code == status and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert client.get("/health").status_code == 200
    out = complete(client, prompt=PROMPTS[0], max_tokens=4, return_token_ids=True)
    assert out["choices"][0]["token_ids"] == solo(PROMPTS[0], 4)


DEEP = b"[" * 1000 + b"]" * 1000  # json.loads: RecursionError
DIGITS = b"1" * 5000  # json.loads: ValueError (int digit limit)
HUGE = b"1" + b"0" * 400  # a number past any float or any seed
# Found by a fuzz (issue 20): each was a 500 (or a later failure). (route, raw body, param, words)
FUZZ_VALUES = {  # a parameter: (its raw JSON value beside the prompt "x", the error's words)
    "model": [(b'"\\udfff"', "not valid Unicode")],
    "temperature": [(b"NaN", "finite, got NaN"), (b"-Infinity", "finite, got -Infinity"), (HUGE, "too large")],
    "top_p": [(b"NaN", "(0, 1]"), (b"Infinity", "(0, 1]"), (HUGE, "too large")],
    "top_k": [(b"NaN", "integer")],
    "max_tokens": [(b"Infinity", "integer"), (DIGITS, "4300 digits")],
    "presence_penalty": [(b"NaN", "[-2, 2]")],
    "repetition_penalty": [(b"Infinity", "> 0")],
    "min_p": [(b"NaN", "[0, 1]")],
    "seed": [(HUGE, "integer in")],
}
FUZZ = [
    ("/v1/completions", b'{"prompt": ' + DEEP + b"}", "prompt", "nested too deep"),
    (
        "/v1/completions",
        b'{"stop": {"a": ' + b'{"a": ' * 99 + b"1" + b"}" * 100 + b"}",
        "stop",
        "nested too deep",
    ),  # parses, but deeper than any body needs
    ("/v1/completions", DEEP, None, "nested too deep"),
    ("/v1/tinyllm/abort", b'{"rid": ' + DEEP + b"}", "rid", "nested too deep"),
    ("/v1/completions", b'{"prompt": "\\udfff"}', "prompt", "not valid Unicode"),
    ("/v1/completions", b'{"prompt": ["ok \\ud800"]}', "prompt", "not valid Unicode"),
    ("/v1/tinyllm/abort", b'{"rid": ' + DIGITS + b"}", "rid", "4300 digits"),
    ("/v1/tinyllm/abort", b'{"rid": NaN}', "rid", "integer"),
    ("/v1/completions", b'{"prompt": [1, "' + b"x" * 100_000 + b'"]}', "prompt", "integers >= 0"),
    *[
        ("/v1/completions", b'{"prompt": "x", "%s": %s}' % (param.encode(), raw), param, says)
        for param, values in FUZZ_VALUES.items()
        for raw, says in values
    ],
]


@pytest.mark.parametrize("route, raw, param, says", FUZZ, ids=[f"{i}-{f[2]}" for i, f in enumerate(FUZZ)])
def test_fuzzed_bodies_get_a_400_that_says_what_and_where(client, route, raw, param, says):
    r = client.post(route, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text[:500]
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param and says in err["message"], err
    assert len(err["message"]) < 300, err["message"][:500]  # quotes the value, never all of it
    if says == "nested too deep":
        assert "line 1 column" in err["message"]  # where
    assert client.get("/health").status_code == 200


# A user trial's messages: each says what is allowed, and quotes the value as the JSON sent.
MESSAGES = [  # (body, param, message)
    ({"top_k": -5}, "top_k", "top_k must be an integer >= 1, or 0 / -1 / null for no limit, got -5"),
    ({"logprobs": True}, "logprobs", "logprobs must be an integer from 0 to 20 or null, got true"),
    ({"top_p": 0}, "top_p", "top_p must be a number in (0, 1] or null (off), got 0"),
    (
        {"stop": ["a"] * 17},
        "stop",
        'stop takes at most 16 strings of at most 256 characters each, got ["a", "a", '
        '"a", "a", "a", "a", "a", "a", "a", "a", "a", "...',
    ),  # cut to 60 characters
    ({"echo": 1}, "echo", "echo must be a boolean, got integer"),
    (
        {"max_tokens": 0},
        "max_tokens",
        "max_tokens must be at least 1 (0 only with echo: true, which returns the prompt alone), got 0",
    ),
    (
        {"best_of": 2},
        "best_of",
        "best_of is not supported by this server (it returns all n samples, it does not "
        "pick the best of several): leave it out or send 1, got 2",
    ),
    ({"min_tokens": 17}, "min_tokens", "min_tokens must be an integer from 0 to max_tokens (16), got 17"),
    (
        {"priority": True},
        "priority",
        "priority must be an integer in (-2147483648, 2147483648) (lower runs first), got true",
    ),
    ({"max_tokens": 1.5}, "max_tokens", "max_tokens must be an integer, got 1.5"),  # (it said "got number")
    ({"seed": "7"}, "seed", "seed must be an integer, got string"),
    # a field no route knows was ignored: a typo ran at the default (OpenAI refuses it)
    ({"max_token": 5}, "max_token", "unrecognized request argument \"max_token\": did you mean 'max_tokens'?"),
    ({"messages": []}, "messages", 'unrecognized request argument "messages": messages goes to /v1/chat/completions'),
    (
        {"foo": 1},
        "foo",
        'unrecognized request argument "foo": this route takes echo, frequency_penalty, '
        "ignore_eos, logprobs, max_tokens, min_p, min_tokens, model, n, presence_penalty, "
        "priority, prompt, repetition_penalty, return_token_ids, seed, stop, stop_token_ids, stream, "
        "stream_options, temperature, top_k, top_p, user",  # (not best_of, logit_bias, suffix: refused)
    ),
]


def test_a_whole_number_written_as_a_float_is_that_integer_as_in_vllm(client):
    """vLLM's request models (pydantic, lax) take 16.0 for an integer field; it was a 400."""
    out = client.post(
        "/v1/completions",
        json={"prompt": "x", "max_tokens": 3.0, "n": 1.0, "seed": 7.0, "logprobs": 1.0, "temperature": 0},
    )
    assert out.status_code == 200, out.text
    choice = out.json()["choices"][0]
    assert out.json()["usage"]["completion_tokens"] == 3 and len(choice["logprobs"]["top_logprobs"][0]) == 1
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2.0, "logprobs": 1.0}
    assert client.post("/v1/chat/completions", json=chat).status_code == 400  # chat's logprobs is a boolean


def test_an_unknown_field_is_refused_with_what_the_route_takes(client):
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "prompt": "x"})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "prompt" and err["code"] == "unrecognized_parameter"
    assert err["message"] == 'unrecognized request argument "prompt": prompt goes to /v1/completions'
    for name in ("chat_template_kwargs", "reasoning_effort"):  # it suggested chat_template (refused), response_format
        chat = {"messages": [{"role": "user", "content": "hi"}], name: {}}
        message = client.post("/v1/chat/completions", json=chat).json()["error"]["message"]
        assert "did you mean" not in message and "chat_template," not in message, message
    for ignored in ({"metadata": {"k": "v"}}, {"store": False}, {"user": "u"}):  # OpenAI's bookkeeping: taken
        assert client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, **ignored}).status_code == 200


@pytest.mark.parametrize("body, param, message", MESSAGES, ids=[m[1] for m in MESSAGES])
def test_messages_say_what_is_allowed_in_json_terms(client, body, param, message):
    r = client.post("/v1/completions", json={"prompt": "x", **body})
    err = r.json()["error"]
    assert r.status_code == 400 and (err["param"], err["message"]) == (param, message), err


def test_top_k_zero_and_minus_one_mean_no_limit(client, solo):
    want = solo(PROMPTS[1], 4)
    for top_k in (0, -1, None):
        assert (
            complete(client, prompt=PROMPTS[1], max_tokens=4, top_k=top_k, return_token_ids=True)["choices"][0][
                "token_ids"
            ]
            == want
        ), top_k


def test_a_prompt_too_long_for_the_context_is_refused_before_tokenizing(client, model_tok, monkeypatch):
    """Tokenizing megabytes takes seconds: a text with more bytes than the context's tokens could
    cover (each at most the vocabulary's longest token) is refused without it."""
    _, tok = model_tok
    real, seen = tok.encode, []
    monkeypatch.setattr(tok, "encode", lambda text, *a, **k: seen.append(len(text)) or real(text, *a, **k))
    huge, most = "a" * 100_000, max_token_bytes(tok)
    assert most is not None and len(huge) > most * 512
    at_least = -(-len(huge) // most)
    r = client.post("/v1/completions", json={"prompt": huge})
    err = r.json()["error"]
    assert r.status_code == 400 and (err["param"], err["code"]) == ("prompt", "context_length_exceeded"), err
    assert err["message"] == (
        f"This model's maximum context length is 512 tokens. However, you requested at least "
        f"{at_least + 16} tokens (at least {at_least} in your prompt; 16 for the completion). "
        "Please reduce your prompt."
    )
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": huge}]})
    err = r.json()["error"]
    assert r.status_code == 400 and (err["param"], err["code"]) == ("messages", "context_length_exceeded"), err
    assert err["message"].endswith(
        f"However, your prompt has at least {at_least} tokens, which leaves no room for "
        f"the completion. Please reduce your prompt."
    )  # no max_tokens sent: none named
    assert seen == []  # neither was tokenized
    r = client.post("/v1/completions", json={"prompt": "a b " * 400})  # within the bound: tokenized, counted
    assert r.status_code == 400 and "at least" not in r.json()["error"]["message"] and seen == [1600]


@pytest.mark.parametrize("prompt", ["Hello there", [1, 2, 3]], ids=["text", "token ids"])
def test_a_completion_budget_too_long_names_max_tokens_and_the_real_prompt_count(client, model_tok, prompt):
    """A short prompt with a huge max_tokens: the 400 names max_tokens (param and what to reduce)
    and gives the prompt's real token count, not a lower bound from its bytes."""
    n = len(model_tok[1].encode(prompt)) if isinstance(prompt, str) else len(prompt)
    err = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 99999999}).json()["error"]
    assert (err["param"], err["code"]) == ("max_tokens", "context_length_exceeded"), err
    assert err["message"] == (
        f"This model's maximum context length is 512 tokens. However, you requested "
        f"{n + 99999999} tokens ({n} in your prompt; 99999999 for the completion). "
        "Please reduce max_tokens."
    )
    huge = "a" * 100_000  # too long on its own, and so is the budget
    err = client.post("/v1/completions", json={"prompt": huge, "max_tokens": 99999999}).json()["error"]
    assert err["param"] == "prompt" and err["message"].endswith("Please reduce your prompt and max_tokens."), err


def test_tokenizing_runs_off_the_event_loop(server, model_tok, monkeypatch):
    """While one prompt is being tokenized, the server answers others (a long prompt used to
    stall /health for seconds)."""
    _, tok = model_tok
    real, entered, gate = tok.encode, threading.Event(), threading.Event()

    def held(text, *a, **k):
        if text == "HELD:\n":
            entered.set()
            assert gate.wait(30)
        return real(text, *a, **k)

    monkeypatch.setattr(tok, "encode", held)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(
            httpx.post, server.url + "/v1/completions", json={"prompt": "HELD:\n", "max_tokens": 2}, timeout=TIMEOUT
        )
        try:
            assert entered.wait(30)
            assert httpx.get(server.url + "/health", timeout=30).status_code == 200  # while it tokenizes
        finally:
            gate.set()
        assert fut.result().status_code == 200


def test_max_token_bytes_only_where_it_bounds_every_tokenization(model_tok):
    from tokenizers import Tokenizer as HF
    from tokenizers import models, normalizers, pre_tokenizers

    def bpe(**kw) -> HF:
        return HF(models.BPE(vocab={"a": 0, "b": 1, "ab": 2, "<unk>": 3}, merges=[("a", "b")], **kw))

    assert max_token_bytes(model_tok[1]) == max(len(t.encode()) for t in model_tok[1].hf.get_vocab())
    llama2 = bpe(byte_fallback=True)  # Llama 2's shape: spaces become "\u2581"
    llama2.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    assert max_token_bytes(Tokenizer(llama2)) == 5
    dropping = bpe(byte_fallback=True)
    dropping.pre_tokenizer = pre_tokenizers.Whitespace()  # spaces vanish: no bound
    for tok in (bpe(), bpe(unk_token="<unk>", fuse_unk=True), dropping):  # unknowns dropped / fused; spaces
        assert max_token_bytes(Tokenizer(tok)) is None


def test_a_pool_smaller_than_the_context_names_what_to_reduce(model_tok):
    """An engine whose pool holds less than max_len (the CLI refuses one; an embedder may build
    it): the 400 says so, and names max_tokens when the prompt alone fits."""
    model, tok = model_tok
    engine = ContinuousEngine(model, 2, None, kv="paged", block_size=16, kv_blocks=3, chunked_prefill=True)
    with (
        ServerThread(create_app(EngineLoop(engine), tok, MODEL)) as s,
        httpx.Client(base_url=s.url, timeout=TIMEOUT) as c,
    ):
        for body, param, reduce in (
            ({"prompt": [1] * 40, "max_tokens": 16}, "max_tokens", "max_tokens"),
            ({"prompt": [1] * 48, "max_tokens": 1}, "prompt", "your prompt"),
        ):
            err = c.post("/v1/completions", json=body).json()["error"]
            n = len(body["prompt"])
            assert (err["param"], err["code"]) == (param, "context_length_exceeded"), err
            assert err["message"] == (
                f"This server's KV cache holds at most 48 tokens for one request. However, you "
                f"requested {n + body['max_tokens']} tokens ({n} in your prompt; "
                f"{body['max_tokens']} for the completion). Please reduce {reduce}."
            )
        err = c.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
        ).json()["error"]
        assert (err["param"], err["code"]) == ("max_tokens", "context_length_exceeded"), err
        assert complete(c, prompt=[1] * 40, max_tokens=8)["usage"]["completion_tokens"] == 8


def test_brackets_inside_text_are_not_nesting(client):
    out = complete(client, prompt="[{" * 100, max_tokens=1, user="[" * 100)  # text, not 200 levels
    assert out["usage"]["completion_tokens"] == 1


def test_extreme_sampling_values_are_served(client, solo):
    """Values validation accepts must never fail in the sampler: a temperature below 1e-5 is
    greedy (as vLLM), and top_p that float32 rounds to 0 still keeps the most likely token."""
    want = solo(PROMPTS[1], 6)
    for extra in (
        {"temperature": 1e-39},
        {"temperature": 1e-6},
        {"temperature": 1.0, "top_p": 1e-46},
        {"temperature": 1e300, "top_k": 1},
        {"temperature": 1e300, "top_p": 5e-324},
    ):
        out = complete(client, prompt=PROMPTS[1], max_tokens=6, return_token_ids=True, **extra)
        assert out["choices"][0]["token_ids"] == want, extra
    r = client.post(
        "/v1/completions",
        json={
            "model": MODEL,
            "prompt": PROMPTS[1],
            "max_tokens": 6,
            "stream": True,
            "temperature": 1e-39,
            "return_token_ids": True,
        },
    )
    events = sse_events(r.text.split("\n"))
    assert r.status_code == 200 and events[-1] == "[DONE]" and not any("error" in e for e in events[:-1])
    assert [t for e in events[:-1] for t in e["choices"][0]["token_ids"]] == want


# -- issue 24: stop strings, stop token ids, min_tokens, seed, penalties, logprobs -----------------------
def _stream(client, **body) -> list:
    r = client.post("/v1/completions", json={"model": MODEL, "temperature": 0, "stream": True, **body})
    assert r.status_code == 200, r.text
    events = sse_events(r.text.split("\n"))
    assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1])
    return [e for e in events[:-1] if e["choices"]]


def test_stop_strings_cut_the_text_and_never_leak_into_a_stream(client, server, model_tok, solo):
    _, tok = model_tok
    prompt = PROMPTS[2]
    ids = solo(prompt, 40)
    text_at = [tok.decode(ids[:i], skip_special_tokens=True) for i in range(len(ids) + 1)]
    full = text_at[-1]
    k = next(i for i in range(len(ids) // 2, len(ids)) if len(text_at[i]) >= 2 and text_at[i + 1] != text_at[i])
    stop = full[len(text_at[k]) - 2 : len(text_at[k]) + 2]  # spans the boundary between two tokens
    want = full[: full.find(stop)]
    n = next(i for i in range(len(ids) + 1) if stop in text_at[i])  # the token that completes it
    out = complete(client, prompt=prompt, max_tokens=40, stop=["never here", stop], return_token_ids=True)
    ch = out["choices"][0]
    assert (ch["text"], ch["finish_reason"]) == (want, "stop")
    assert ch["token_ids"] == ids[:n] and out["usage"]["completion_tokens"] == n
    chunks = _stream(client, prompt=prompt, max_tokens=40, stop=stop, stream_options={"include_usage": True})
    so_far = ""
    for c in chunks:
        so_far += c["choices"][0]["text"]
        assert want.startswith(so_far), (so_far, want)  # nothing emitted is later cut
    assert so_far == want and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    wait_idle(server)
    assert_nothing_held(server)  # the engine ended it: no slot, no block


def test_stop_token_ids_and_min_tokens(client, solo):
    ids = solo(PROMPTS[0], 20)
    t = ids[5]
    first = ids.index(t)
    ch = complete(client, prompt=PROMPTS[0], max_tokens=20, stop_token_ids=[t], return_token_ids=True)["choices"][0]
    assert ch["token_ids"] == ids[: first + 1] and ch["finish_reason"] == "stop"
    ch = complete(
        client, prompt=PROMPTS[0], max_tokens=20, stop_token_ids=[t], min_tokens=first + 3, return_token_ids=True
    )["choices"][0]
    got = ch["token_ids"]
    assert len(got) >= first + 3 and t not in got[: first + 3] and got[:first] == ids[:first]


def test_a_seeded_request_repeats_whatever_runs_beside_it(server, client):
    body = {
        "model": MODEL,
        "prompt": PROMPTS[4],
        "max_tokens": 16,
        "temperature": 1.0,
        "seed": 1234,
        "top_p": 0.95,
        "min_p": 0.02,
        "presence_penalty": 0.3,
        "frequency_penalty": 0.2,
        "repetition_penalty": 1.1,
        "return_token_ids": True,
        "ignore_eos": True,
    }
    alone = complete(client, **body)["choices"][0]["token_ids"]
    others = [{**body, "prompt": p, "seed": None} for p in PROMPTS[5:11]]

    def post(b: dict) -> list[int]:
        r = httpx.post(server.url + "/v1/completions", json=b, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["token_ids"]

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        with engine_held(server.engine_loop, waiting=8):  # all eight start together, on any machine
            futs = [ex.submit(post, b) for b in [body, *others, {**body, "seed": 4321}]]
        got = [f.result() for f in futs]
    assert got[0] == alone  # batched with six others (and cached prompt)
    assert got[-1] != alone  # another seed, other draws
    again = [t for c in _stream(client, **body) for t in c["choices"][0]["token_ids"]]
    assert again == alone  # streamed too


def test_logprobs_in_openais_completions_shape(client, model_tok, solo):
    _, tok = model_tok
    want = solo(PROMPTS[1], 6)
    out = complete(client, prompt=PROMPTS[1], max_tokens=6, logprobs=3, return_token_ids=True)
    ch = out["choices"][0]
    lp = ch["logprobs"]
    assert ch["token_ids"] == want and set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert lp["tokens"] == [tok.token_text(t) for t in want]
    assert all(len(x) == len(want) for x in lp.values())
    for chosen, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
        assert len(top) <= 3 and chosen == max(top.values()) and chosen <= 0  # greedy: the top token
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(want))]
    streamed = [c["choices"][0]["logprobs"] for c in _stream(client, prompt=PROMPTS[1], max_tokens=6, logprobs=3)]
    assert [t for s in streamed if s for t in s["tokens"]] == lp["tokens"]
    assert [o for s in streamed if s for o in s["text_offset"]] == lp["text_offset"]
    assert [v for s in streamed if s for v in s["token_logprobs"]] == pytest.approx(lp["token_logprobs"])
    assert complete(client, prompt=PROMPTS[1], max_tokens=2)["choices"][0]["logprobs"] is None


def test_the_openai_client_sends_every_new_parameter(server, model_tok):
    """completions.create with every issue-24 parameter, non-streaming and streaming: both work,
    and being seeded, both give the same text and tokens."""
    import openai

    _, tok = model_tok
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", timeout=60, max_retries=0)
    kw = dict(
        model=MODEL,
        prompt=PROMPTS[3],
        max_tokens=32,
        temperature=0.9,
        top_p=0.95,
        seed=7,
        stop=["\n\n", "zzz"],
        presence_penalty=0.5,
        frequency_penalty=0.5,
        logprobs=2,
        extra_body={
            "top_k": 40,
            "min_p": 0.05,
            "repetition_penalty": 1.2,
            "min_tokens": 4,
            "stop_token_ids": [tok.encode("?")[0]],
        },
    )
    r = c.completions.create(**kw)
    ch = r.choices[0]
    assert ch.finish_reason in ("stop", "length") and "\n\n" not in ch.text
    assert len(ch.logprobs.tokens) == r.usage.completion_tokens >= 4
    chunks = list(c.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert "".join(x.text for k in chunks for x in k.choices) == ch.text
    assert [t for k in chunks for x in k.choices if x.logprobs for t in x.logprobs.tokens] == ch.logprobs.tokens
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


# -- load and disconnects --------------------------------------------------------------------------
async def _stream_tokens(ac: httpx.AsyncClient, prompt: str, n: int) -> list[int]:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": n,
        "temperature": 0,
        "stream": True,
        "return_token_ids": True,
    }
    async with ac.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        events = sse_events([line async for line in r.aiter_lines()])
    assert events[-1] == "[DONE]"
    return [t for e in events[:-1] for t in e["choices"][0]["token_ids"]]


def _openai_stream(url: str, prompt: str, n: int) -> tuple[str, dict]:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=60, max_retries=0)
    text, usage = [], None
    for chunk in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=n, temperature=0, stream=True, stream_options={"include_usage": True}
    ):
        text += [c.text for c in chunk.choices]
        usage = chunk.usage or usage
    return "".join(text), usage


async def test_64_concurrent_streaming_clients(server, model_tok, solo):
    _, tok = model_tok
    n = 8
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(64)]
    want = {p: solo(p, n) for p in PROMPTS}  # before the clients: not timed against them
    async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT, limits=httpx.Limits(max_connections=100)) as ac:
        oa = asyncio.to_thread(_openai_stream, server.url, prompts[0], n)
        results = await asyncio.wait_for(asyncio.gather(oa, *(_stream_tokens(ac, p, n) for p in prompts[1:])), 120)
    text, usage = results[0]
    assert text == tok.decode(want[prompts[0]], skip_special_tokens=True)
    assert usage.completion_tokens == len(want[prompts[0]]) and usage.prompt_tokens == len(tok.encode(prompts[0]))
    assert all(got == want[p] for got, p in zip(results[1:], prompts[1:]))
    wait_idle(server)
    assert_nothing_held(server)


async def _disconnect(ac: httpx.AsyncClient, prompt: str, after_chunks: int) -> int:
    """Start a long stream, read ``after_chunks`` data chunks (0: only the headers), hang up."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 400, "temperature": 0, "stream": True, "ignore_eos": True}
    got = 0
    async with ac.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        if after_chunks:
            async for line in r.aiter_lines():
                got += line.startswith("data: ")
                if got >= after_chunks:
                    break
    return got


async def test_clients_that_disconnect_mid_stream_free_everything(slow_server):
    """(On the slow server: on a fast enough machine, a request could reach its 400 tokens
    before its client's hang-up reached the engine.)"""
    server = slow_server
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as client:
        aborted0 = metric(metrics(client), "vllm:request_success_total", finished_reason="abort")
        n_before = len(engine_call(server, lambda e: e.snapshot().requests))
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT, limits=limits) as ac:
            # half hang up after 2 chunks (running), half as soon as the headers came (mostly still queued)
            got = await asyncio.wait_for(
                asyncio.gather(*(_disconnect(ac, f"{PROMPTS[i % 16]}{i}", 2 * (i % 2)) for i in range(32))), 60
            )
        assert got == [2 * (i % 2) for i in range(32)]
        wait_idle(server, timeout=60)  # (a backstop: the checks below say the aborts freed them)
        assert_nothing_held(server)
        views = engine_call(server, lambda e: e.snapshot().requests)[n_before:]
        assert len(views) == 32 and all(v.state == "aborted" and len(v.tokens) < 400 for v in views)
        m = metrics(client)
        assert metric(m, "vllm:request_success_total", finished_reason="abort") - aborted0 == 32
        assert metric(m, "vllm:num_requests_running") == 0 and metric(m, "vllm:kv_cache_usage_perc") == 0


def test_nonstreaming_client_that_disconnects_is_aborted(server, caplog, monkeypatch):
    n_before = len(engine_call(server, lambda e: e.snapshot().requests))
    body = {"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 400, "temperature": 0, "ignore_eos": True}
    raw = json.dumps(body).encode()
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw)
    )
    # Once it has a token, the engine is held still between two steps (a call into its thread)
    # while the client hangs up, until the server has asked for the abort: on a fast machine 400
    # tokens could finish first, and a client with a read timeout gave up before the first token
    # on a busy one (this must not depend on the machine's speed).
    deadline = time.monotonic() + 30
    while not any(v.tokens for v in engine_call(server, lambda e: e.snapshot().requests)[n_before:]):
        assert time.monotonic() < deadline, "the request never produced a token"
        time.sleep(0.01)
    asked, loop = threading.Event(), server.engine_loop
    abort = loop.abort
    monkeypatch.setattr(loop, "abort", lambda handle: (abort(handle), asked.set()))
    hung_up, holding = threading.Event(), threading.Event()
    holder = threading.Thread(target=lambda: engine_call(server, lambda e: (holding.set(), hung_up.wait(30))))
    holder.start()
    assert holding.wait(30), "the engine thread never took the hold"
    sock.close()
    assert asked.wait(30), "the server never aborted the request of a client that hung up"
    hung_up.set()
    holder.join(30)
    wait_idle(server, timeout=15)
    assert_nothing_held(server)
    views = engine_call(server, lambda e: e.snapshot().requests)[n_before:]
    assert len(views) == 1 and views[0].state == "aborted" and 0 < len(views[0].tokens) < 400
    gc.collect()  # asyncio says "never retrieved" when such a future is freed
    assert "never retrieved" not in caplog.text, caplog.text


# -- the engine loop alone ---------------------------------------------------------------------------
async def test_engine_loop_hooks_rejects_and_stop():
    model = random_model()
    eng = ContinuousEngine(model, 2, 64, kv="paged", chunked_prefill=True)
    seen: list = []
    threads: set = set()

    def hook(engine, events, lifecycle):
        threads.add(threading.current_thread())
        seen.append((len(events), [e.kind for e in lifecycle], engine.snapshot().num_requests_running))

    def broken(engine, events, lifecycle):
        raise RuntimeError("a broken viewer")

    loop = EngineLoop(eng, on_step=hook)
    loop.add_step_hook(broken)  # logged, never stops the loop
    with pytest.raises(RuntimeError):  # not started yet
        loop.submit(Request([1, 2, 3], 4))
    loop.start()
    try:
        h = loop.submit(Request([1, 2, 3], 5))
        assert await h.accepted() == 0
        toks = []
        for _ in range(10):
            out = await asyncio.wait_for(h.next_output(), 10)
            toks += out.tokens
            if out.finished:
                break
        assert toks == generate(model, [1, 2, 3], 5) and out.finish_reason == "length"
        await loop.call_async(lambda e: None)  # the step's hooks run after its outputs
        assert threads == {loop.thread}  # are delivered: wait for that iteration
        kinds = [k for _, ks, _ in seen for k in ks]
        assert kinds[:2] == ["queued", "admitted"] and kinds[-1] == "finished"
        assert sum(n for n, _, _ in seen) == 5
        for bad in (Request([999], 4), Request([1] * 60, 10)):  # out of vocab; longer than max_len
            with pytest.raises(RequestRejected):
                await loop.submit(bad).accepted()
        assert loop.alive and await loop.call_async(lambda e: e.has_work()) is False
        assert loop.call(lambda e: e.results) == {}  # finished results are popped
        real_step = eng.step

        def broken_step():
            raise RuntimeError("a broken step")

        loop.call(lambda e: setattr(e, "step", broken_step))  # a bug in the engine: its requests fail,
        with pytest.raises(RequestFailed, match="a broken step"):  # the loop lives on
            h = loop.submit(Request([1, 2, 3], 5))
            await h.accepted()
            await asyncio.wait_for(h.next_output(), 10)
        loop.call(lambda e: setattr(e, "step", real_step))
        assert loop.thread.is_alive() and loop.call(lambda e: e.has_work()) is False

        def slow_step():  # 50 tokens take >= 2.5 s: the stop
            out = real_step()  # below comes first on any machine
            time.sleep(0.05)
            return out

        loop.call(lambda e: setattr(e, "step", slow_step))
        long = loop.submit(Request([4, 5], 50))
        await long.accepted()
        await asyncio.wait_for(long.next_output(), 10)
    finally:
        await asyncio.to_thread(loop.stop)
    assert not loop.thread.is_alive()
    with pytest.raises(RequestFailed, match="shutting down"):  # the unfinished request is told
        for _ in range(60):
            await asyncio.wait_for(long.next_output(), 10)
    assert eng.slots.allocated_tokens() == 0 and not eng.has_work()


# -- the CLI ---------------------------------------------------------------------------------------
def test_cli_serve_prints_url_serves_and_stops_on_ctrl_c():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen(
        [sys.executable, "-m", "tinyllm.cli", "serve", "--port", "0", "--slots", "2", "--served-model-name", "bard"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = p.stdout.readline()  # blocks until ready (or exit)
        assert line.startswith("tinyllm serve: bard on http://127.0.0.1:"), (line, p.stderr.read())
        url = line.split()[4]
        assert httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"] == "bard"
        r = httpx.post(url + "/v1/completions", json={"model": "bard", "prompt": "ROMEO:", "max_tokens": 3}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        assert httpx.get(url + "/health", timeout=10).status_code == 200  # serving: now Ctrl+C
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)  # a backstop: it takes about a second
        assert p.returncode == 130, (out, err)  # as every tinyllm command on Ctrl+C
        assert out == "tinyllm serve: stopped (Ctrl+C)\n" and err == "", (out, err)  # one line, no traceback
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)


def test_serve_options_left_out_are_the_servers_config():
    """``tinyllm serve`` with no engine option runs ``SERVER_CONFIG`` (the parser's defaults and
    build_engine's default are written in two places: this keeps them one)."""
    from tinyllm.cli import build_parser
    from tinyllm.config import EngineConfig
    from tinyllm.serve.server import SERVER_CONFIG

    args = build_parser().parse_args(["serve"])
    assert EngineConfig.from_args(args) == SERVER_CONFIG.replace(threads=args.threads)
    given = build_parser().parse_args(
        ["serve", "--kv-memory", "16", "--max-num-seqs", "4", "--max-batched-tokens", "64"]
    )
    assert EngineConfig.from_args(given) == SERVER_CONFIG.replace(
        threads=2, kv_memory_mib=16.0, max_num_seqs=4, max_batched_tokens=64
    )


@pytest.mark.parametrize(
    "args, says",
    [
        (["--port", "70000"], "--port"),
        (["--slots", "0"], "--slots"),
        (["--max-len", "9999"], "--max-len"),
        (["--served-model-name", " "], "--served-model-name"),
        (["--kv-blocks", "1"], "--kv-blocks 1 is too small for one request: the pool holds 1 block of 16 tokens"),
        (["--host", "192.0.2.1"], "cannot listen"),
        (["--max-num-seqs", "4"], "--max-num-seqs goes with --kv-memory"),  # (not a silent 8 slots)
    ],
)
def test_cli_serve_bad_options_are_one_line_exit_2(args, says, capsys):
    err = cli_refusal(["serve", "--port", "0", "--device", "cpu", *args], capsys)
    assert "error" in err and says in err, err
