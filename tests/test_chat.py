"""`/v1/chat/completions`, `/tokenize`, `/detokenize` and the per-request accounting field.

One server (bundled model, its play-script chat template) runs in a thread for the module. Greedy
chat output must equal solo ``generate()`` of the prompt the template renders; the template must
render exactly as Hugging Face transformers renders it; every malformed chat body is a 400 in
OpenAI's shape naming the field.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.helpers import SERVED_MODEL, check_invariants, engine_held, serve_in_thread
from tinyllm.engine.solo import generate
from tinyllm.model.config import BUNDLED_MODEL
from tinyllm.model.train import PLAY_CHAT_TEMPLATE
from tinyllm.request import TokenLogprob
from tinyllm.serve import EngineLoop, ServerThread, build_engine, create_app
from tinyllm.serve.chat import ChatShape, chat_logprobs, parse_chat
from tinyllm.serve.chat_template import ChatTemplateError, render
from tinyllm.serve.completions import Piece
from tinyllm.serve.protocol import ApiError, GenerationParams, parse_completion

MODEL = SERVED_MODEL
TIMEOUT = httpx.Timeout(60.0)
CHAT = [{"role": "system", "content": "A street in Verona."}, {"role": "user", "content": "Who goes there?"}]
ACCOUNTING_KEYS = {"queue_ms", "prefill_ms", "decode_ms", "e2e_ms", "preemptions", "cached_tokens"}


@pytest.fixture(scope="module")
def server(model_tok):
    s = serve_in_thread(*model_tok, slots=4)
    yield s
    s.stop()


def rendered(messages, add_generation_prompt=True) -> str:
    return render(PLAY_CHAT_TEMPLATE, messages, add_generation_prompt)


def solo(model_tok, prompt: str, n: int) -> list[int]:
    model, tok = model_tok
    return generate(model, tok.encode(prompt), n, eos_id=tok.eos_id)


def sse(r) -> list:
    out = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    return [x if x == "[DONE]" else json.loads(x) for x in out]


def check_accounting(acc: dict, usage: dict) -> None:
    """The extension field: every figure there, none negative, the phases adding up to the whole."""
    assert set(acc) == ACCOUNTING_KEYS, acc
    assert all(acc[k] is not None and acc[k] >= 0 for k in ACCOUNTING_KEYS), acc
    assert abs(acc["queue_ms"] + acc["prefill_ms"] + acc["decode_ms"] - acc["e2e_ms"]) < 0.01, acc
    assert acc["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]


# -- the template ---------------------------------------------------------------------------------
def test_bundled_template_is_a_play_script(model_tok):
    _, tok = model_tok
    assert tok.chat_template == PLAY_CHAT_TEMPLATE  # shipped in tokenizer_config.json
    assert rendered(CHAT) == "SYSTEM:\nA street in Verona.\n\nUSER:\nWho goes there?\n\nASSISTANT:\n"
    assert rendered([{"role": "user", "content": "Hi", "name": "Romeo"}], False) == "ROMEO:\nHi\n\n"


def test_template_sources_a_checkpoint_can_have(tmp_path):
    """tokenizer_config.json's string, its list of named templates ("default"), chat_template.jinja
    beside it; and a retrained bundled tokenizer keeps the play template."""
    from tinyllm.model.tokenizer import Tokenizer
    from tinyllm.model.train import train_tokenizer

    train_tokenizer(["ROMEO:\nHello there, good friend.\n"] * 5, 300, tmp_path)
    assert Tokenizer.from_dir(tmp_path).chat_template == PLAY_CHAT_TEMPLATE
    cfg = tmp_path / "tokenizer_config.json"
    meta = json.loads(cfg.read_text())
    cfg.write_text(
        json.dumps(
            {**meta, "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}
        )
    )
    assert Tokenizer.from_dir(tmp_path).chat_template == "D"
    cfg.write_text(json.dumps({k: v for k, v in meta.items() if k != "chat_template"}))
    assert Tokenizer.from_dir(tmp_path).chat_template is None
    (tmp_path / "chat_template.jinja").write_text("J")
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.chat_template == "J" and tok.special_tokens["eos_token"] == "<|endoftext|>"


LLAMA3ISH = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] not in ['user', 'assistant', 'system'] %}"
    "{{ raise_exception('bad role ' + m['role']) }}{% endif %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}{{ messages | tojson }}"
)


@pytest.mark.parametrize("template", [PLAY_CHAT_TEMPLATE, LLAMA3ISH], ids=["play", "llama3ish"])
@pytest.mark.parametrize("agp", [True, False])
def test_render_equals_transformers_apply_chat_template(template, agp):
    """The same environment as transformers: trim_blocks/lstrip_blocks, tojson keeping non-ASCII,
    the special tokens as variables."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(BUNDLED_MODEL))
    msgs = [*CHAT, {"role": "assistant", "content": "  Ay, ’tis I.  "}, {"role": "user", "content": "Où?"}]
    want = hf.apply_chat_template(msgs, chat_template=template, tokenize=False, add_generation_prompt=agp)
    got = render(template, msgs, agp, {"bos_token": hf.bos_token, "eos_token": hf.eos_token})
    assert got == want and "Où" in got


@pytest.mark.parametrize(
    "template, says",
    [
        (None, "no chat template"),
        ("{% for m in messages %}", "does not compile"),
        ("{{ raise_exception('only user turns') }}", "refused these messages: only user turns"),
        ("{{ messages.__class__.__mro__[1].__subclasses__() }}", "failed on these messages"),  # the sandbox
        ("{% set x = messages.append(1) %}", "failed on these messages"),  # immutable
        ("{{ messages[0]['content'] | int + 'x' }}", "failed on these messages"),
    ],
)
def test_template_failures_are_a_template_error(template, says):
    with pytest.raises(ChatTemplateError, match=says.replace("(", r"\(")):
        render(template, CHAT)


# -- chat completions -----------------------------------------------------------------------------
def test_chat_equals_solo_generate_of_the_rendered_prompt(client, model_tok):
    _, tok = model_tok
    want = solo(model_tok, rendered(CHAT), 12)
    r = client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": CHAT, "max_tokens": 12, "temperature": 0, "return_token_ids": True},
    )
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-") and out["model"] == MODEL
    choice = out["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": tok.decode(want, skip_special_tokens=True)}
    assert choice["token_ids"] == want and out["prompt_token_ids"] == tok.encode(rendered(CHAT))
    assert choice["finish_reason"] == ("stop" if want[-1] == tok.eos_id else "length")
    u = out["usage"]
    assert (u["prompt_tokens"], u["completion_tokens"]) == (len(tok.encode(rendered(CHAT))), len(want))
    check_accounting(out["tinyllm"], u)


def test_chat_stream_opens_with_the_role_and_ends_with_usage_and_accounting(client, model_tok):
    _, tok = model_tok
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Speak."}, {"type": "text", "text": "Now!"}]}]
    prompt = rendered([{"role": "user", "content": "Speak.\nNow!"}])  # text parts joined by newlines
    want = solo(model_tok, prompt, 10)
    body = {
        "messages": msgs,
        "max_tokens": 10,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse(r)
    assert events[-1] == "[DONE]"
    opening, *chunks, last = events[:-1]
    assert opening["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["object"] == "chat.completion.chunk" and e["id"] == opening["id"] for e in events[:-1])
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == tok.decode(
        want, skip_special_tokens=True
    )
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == len(want)
    assert last["usage"]["prompt_tokens"] == len(tok.encode(prompt))
    check_accounting(last["tinyllm"], last["usage"])
    assert chunks[-1]["tinyllm"] == last["tinyllm"]  # the finishing chunk carries it too
    assert all("tinyllm" not in c for c in [opening, *chunks[:-1]])


def test_openai_client_chat_streaming_and_not(server, model_tok):
    import openai

    _, tok = model_tok
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="x", timeout=60, max_retries=0)
    msgs = [{"role": "user", "content": "What light through yonder window breaks?"}]
    want = tok.decode(solo(model_tok, rendered(msgs), 8), skip_special_tokens=True)
    out = oa.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0)
    assert out.choices[0].message.content == want and out.choices[0].message.role == "assistant"
    assert out.usage.completion_tokens == 8 and out.usage.prompt_tokens_details.cached_tokens >= 0
    check_accounting(out.model_extra["tinyllm"], out.usage.model_dump())
    text, usage = [], None
    for c in oa.chat.completions.create(
        model=MODEL,
        messages=msgs,
        max_completion_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        text += [ch.delta.content or "" for ch in c.choices]
        usage = c.usage or usage
    assert "".join(text) == want and usage.completion_tokens == 8


def test_openai_client_chat_logprobs_streaming_and_not(server, model_tok):
    """Chat's logprobs shape (logprobs: true + top_logprobs), greedy: each token's text joins to
    the content, and the chosen token is its own best alternative."""
    import openai

    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="x", timeout=60, max_retries=0)
    msgs = [{"role": "user", "content": "Good morrow."}]
    out = oa.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2
    )
    content = out.choices[0].logprobs.content
    assert len(content) == 6 and "".join(c.token for c in content) == out.choices[0].message.content
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].token == c.token and c.logprob <= 0 for c in content)
    assert all(bytes(c.bytes).decode() == c.token for c in content)
    streamed = []
    for ch in oa.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2, stream=True
    ):
        if ch.choices and ch.choices[0].logprobs is not None:
            streamed += ch.choices[0].logprobs.content
    assert [(c.token, c.logprob) for c in streamed] == [(c.token, c.logprob) for c in content]
    plain = oa.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2, temperature=0, logprobs=False)
    assert plain.choices[0].logprobs is None


def test_chat_without_max_tokens_may_use_what_the_context_leaves(client, model_tok):
    _, tok = model_tok
    r = client.post(
        "/v1/chat/completions", json={"messages": CHAT, "temperature": 0, "ignore_eos": True, "stream": True}
    )
    n = sum(1 for e in sse(r)[:-1] if e["choices"][0]["delta"].get("content") is not None) - 1
    assert n > 100  # far past completions' default of 16 (one chunk per token)


def test_same_sampling_surface_on_both_routes():
    """parse_generation is the one parser: a sampling body either works on both routes, with the
    same settings, or is refused by both, naming the same field (logprobs' shapes differ, so it is
    left out)."""
    bodies = [
        {},
        {"temperature": 0.5, "top_p": 0.9, "top_k": 7},
        {"temperature": -1},
        {"top_p": 2},
        {"top_k": "x"},
        {"max_tokens": 0},
        {"stream": "yes"},
        {"stream_options": {"include_usage": True}},
        {"stream": True, "stream_options": {"include_usage": True}},
        {"seed": 3},
        {"stop": ["\n"]},
        {"presence_penalty": 0.5},
        {"frequency_penalty": 0.1},
        {"n": 2},
        {"logit_bias": {"1": 2}},
        {"ignore_eos": 1},
        {"model": "nope"},
        {"max_tokens": 5, "min_p": 0.1, "repetition_penalty": 1.1, "stop_token_ids": [3], "min_tokens": 2},
    ]
    for b in bodies:
        results = []
        for parse, extra in ((parse_completion, {"prompt": "x"}), (parse_chat, {"messages": CHAT})):
            try:
                p = parse({**b, **extra}, MODEL)
                results.append(
                    {
                        f: getattr(p, f)
                        for f in GenerationParams.__dataclass_fields__
                        if f not in ("max_tokens", "max_tokens_field")
                    }
                )  # chat's default differs
            except ApiError as e:
                results.append(("error", e.param))
        assert results[0] == results[1], (b, results)


def test_chat_logprobs_shape(model_tok):
    """OpenAI's chat shape (logprobs: true, top_logprobs: N): token, logprob, bytes, alternatives."""
    _, tok = model_tok
    a, b, c = tok.encode("ROMEO:")[:3]
    obj = chat_logprobs([TokenLogprob(a, -0.5, ((a, -0.5), (b, -1.0), (c, float("-inf"))))], tok.token_text, 2)
    entry = obj["content"][0]
    assert entry["token"] == tok.token_text(a) and entry["logprob"] == -0.5
    assert bytes(entry["bytes"]).decode() == tok.token_text(a)
    assert [t["token"] for t in entry["top_logprobs"]] == [tok.token_text(a), tok.token_text(b)]
    assert (
        chat_logprobs([TokenLogprob(a, float("-inf"), ((c, float("-inf")),))], tok.token_text, 1)["content"][0][
            "top_logprobs"
        ][0]["logprob"]
        == -9999.0
    )  # JSON-safe, as vLLM
    ch = ChatShape.chunk("id", 0, MODEL, Piece("x", None), False, logprobs=obj)
    assert ch["choices"][0]["logprobs"] == obj and ch["choices"][0]["delta"] == {"content": "x"}


BAD_CHAT = [
    ({}, "messages", "must provide messages"),
    ({"messages": "Who goes there?"}, "messages", "array of message objects"),
    ({"messages": {"role": "user"}}, "messages", "array of message objects"),
    ({"messages": []}, "messages", "empty"),
    ({"messages": ["hi"]}, "messages[0]", "object with a role"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role", "no role"),
    ({"messages": [{"role": 3, "content": "hi"}]}, "messages[0].role", "must be a string"),
    ({"messages": [{"role": "king", "content": "hi"}]}, "messages[0].role", "not a role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "missing"),
    ({"messages": [{"role": "user", "content": 7}]}, "messages[0].content", "string or a list of text parts"),
    ({"messages": [{"role": "user", "content": {"text": "x"}}]}, "messages[0].content", "string or a list"),
    ({"messages": [{"role": "user", "content": ["x"]}]}, "messages[0].content[0]", '"type": "text"'),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages[0].content[0].type",
        "text only",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]},
        "messages[0].content[0].text",
        "must be a string",
    ),
    ({"messages": [{"role": "user", "content": "hi", "name": 5}]}, "messages[0].name", "must be a string"),
    ({"messages": [{"role": "user", "content": [[[[["deep"]]]]]}]}, "messages[0].content[0]", "object"),
    ({"messages": CHAT, "max_completion_tokens": -1}, "max_completion_tokens", "at least 1"),
    ({"messages": CHAT, "max_tokens": 500}, "max_tokens", "maximum context length"),
    ({"messages": CHAT, "logprobs": 2}, "logprobs", "boolean"),
    ({"messages": CHAT, "top_logprobs": 3}, "top_logprobs", "needs logprobs: true"),
    ({"messages": CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "from 0 to 20"),
    ({"messages": CHAT, "logprobs": True, "top_logprobs": "2"}, "top_logprobs", "from 0 to 20"),
    ({"messages": CHAT, "tools": [{"type": "function"}]}, "tools", "not supported"),
    ({"messages": CHAT, "chat_template": "{{ 1 }}"}, "chat_template", "not supported"),
    ({"messages": CHAT, "add_generation_prompt": "yes"}, "add_generation_prompt", "boolean"),
    ([CHAT], None, "JSON object"),
]


@pytest.mark.parametrize("body, param, says", BAD_CHAT, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD_CHAT)])
def test_bad_chat_bodies_get_a_400_that_says_what(client, body, param, says):
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param and says in err["message"], err


@pytest.mark.parametrize("field", ["max_completion_tokens", "max_tokens"])
def test_a_completion_budget_too_long_names_its_field_and_the_real_prompt_count(client, model_tok, field):
    """A short chat with a huge budget: the 400 counts the prompt (not a lower bound from its
    bytes) and names the field the client used, as param and as what to reduce."""
    n = len(model_tok[1].encode(rendered(CHAT)))
    err = client.post("/v1/chat/completions", json={"messages": CHAT, field: 99999999}).json()["error"]
    assert (err["param"], err["code"]) == (field, "context_length_exceeded"), err
    assert err["message"] == (
        f"This model's maximum context length is 512 tokens. However, you requested "
        f"{n + 99999999} tokens ({n} in your prompt; 99999999 for the completion). "
        f"Please reduce {field}."
    )


@pytest.mark.parametrize(
    "raw, param, says",
    [
        (
            b'{"messages": [{"role": "user", "content": ' + b"[" * 200 + b"]" * 200 + b"}]}",
            "messages",
            "nested too deep",
        ),
        (b'{"messages": [{"role": "user", "content": "\\udfff"}]}', "messages[0].content", "not valid Unicode"),
        (
            b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
            "messages[0].content[0].text",
            "not valid Unicode",
        ),
        (b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', "temperature", "finite"),
        (b"[" * 5000 + b"]" * 5000, None, "nested too deep"),
    ],
)
def test_fuzzed_chat_bodies_get_a_400(client, raw, param, says):
    r = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"], err
    assert client.get("/health").status_code == 200


@pytest.fixture(scope="module")
def templateless(model_tok):
    """A server over a tokenizer without a chat template (most base checkpoints), or with a
    broken one."""
    model, tok = model_tok

    def start(template):
        t = replace_template(tok, template)
        return serve_in_thread(model, t, slots=2)

    servers = []
    yield lambda template: servers.append(start(template)) or servers[-1]
    for s in servers:
        s.stop()


def replace_template(tok, template):
    from tinyllm.model.tokenizer import Tokenizer

    return Tokenizer(tok.hf, tok.eos_id, tok.bos_id, template, tok.special_tokens)


@pytest.mark.parametrize(
    "template, says",
    [
        (None, "no chat template"),
        ("{{ raise_exception('no system turns') }}", "no system turns"),
        ("{% if %}", "does not compile"),
    ],
)
def test_a_checkpoint_without_a_usable_template_answers_400(templateless, template, says):
    s = templateless(template)
    for path, body in (("/v1/chat/completions", {"messages": CHAT}), ("/tokenize", {"messages": CHAT})):
        r = httpx.post(s.url + path, json=body, timeout=TIMEOUT)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "messages" and err["code"] == "invalid_chat_template" and says in err["message"]
    r = httpx.post(s.url + "/v1/completions", json={"prompt": "ROMEO:\n", "max_tokens": 2}, timeout=TIMEOUT)
    assert r.status_code == 200  # completions still serve


# -- tokenize / detokenize ------------------------------------------------------------------------
def test_tokenize_and_detokenize_in_vllms_shapes(client, server, model_tok):
    _, tok = model_tok
    max_len = server.engine_loop.engine.max_len
    r = client.post("/tokenize", json={"model": MODEL, "prompt": "ROMEO:\nBut soft"})
    assert r.status_code == 200
    ids = tok.encode("ROMEO:\nBut soft")
    assert r.json() == {"count": len(ids), "max_model_len": max_len, "tokens": ids}
    r = client.post("/tokenize", json={"prompt": "ROMEO:", "return_token_strs": True}).json()
    assert "".join(r["token_strs"]) == "ROMEO:" and len(r["token_strs"]) == r["count"]
    r = client.post("/tokenize", json={"messages": CHAT}).json()
    assert r["tokens"] == tok.encode(rendered(CHAT)) and r["count"] == len(r["tokens"])
    r = client.post("/tokenize", json={"messages": CHAT, "add_generation_prompt": False}).json()
    assert r["tokens"] == tok.encode(rendered(CHAT, False))
    r = client.post("/detokenize", json={"model": MODEL, "tokens": ids})
    assert r.status_code == 200 and r.json() == {"prompt": "ROMEO:\nBut soft"}
    assert client.post("/detokenize", json={"tokens": []}).json() == {"prompt": ""}


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/tokenize", {}, "messages"),
        ("/tokenize", {"prompt": "x", "messages": CHAT}, "prompt"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"prompt": "x", "add_special_tokens": "no"}, "add_special_tokens"),
        ("/tokenize", {"messages": [{"role": "user"}]}, "messages[0].content"),
        ("/tokenize", {"prompt": "x", "model": "other"}, "model"),
        ("/tokenize", [1], None),
        ("/tokenize", {"messages": CHAT, "continue_final_message": True}, "continue_final_message"),
        ("/detokenize", {}, "tokens"),
        ("/detokenize", {"tokens": "1 2"}, "tokens"),
        ("/detokenize", {"tokens": [1, -1]}, "tokens"),
        ("/detokenize", {"tokens": [1, 10**9]}, "tokens"),
        ("/detokenize", {"tokens": [1.5]}, "tokens"),
        ("/detokenize", {"tokens": [True]}, "tokens"),
    ],
)
def test_bad_tokenize_bodies_get_a_400(client, path, body, param):
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"], err


# -- accounting -----------------------------------------------------------------------------------
def test_preemptions_and_cached_tokens_are_accounted_per_request(model_tok):
    """A pool too small for four long requests at once: some are preempted, and the per-request
    preemption counts add up to the engine's; a repeated long prompt reports its cached tokens."""
    model, tok = model_tok
    engine = build_engine(model, slots=4, max_len=160, kv_blocks=12, block_size=16)
    with ServerThread(create_app(EngineLoop(engine), tok, MODEL)) as s:
        import concurrent.futures as cf

        prompts = [f"{name}:\n" for name in ("ROMEO", "JULIET", "HAMLET", "OTHELLO")]

        def ask(p):
            r = httpx.post(
                s.url + "/v1/completions",
                json={"prompt": p, "max_tokens": 100, "ignore_eos": True, "temperature": 0},
                timeout=TIMEOUT,
            )
            assert r.status_code == 200, r.text
            return r.json()

        with cf.ThreadPoolExecutor(4) as ex:
            with engine_held(s.engine_loop, waiting=4):  # the four start together, on any machine
                futs = [ex.submit(ask, p) for p in prompts]
            outs = [f.result() for f in futs]
        for o in outs:
            check_accounting(o["tinyllm"], o["usage"])
        total = s.engine_loop.call(lambda e: e.snapshot().counters.preemptions, timeout=30)
        assert total > 0 and sum(o["tinyllm"]["preemptions"] for o in outs) == total
        long = "KING LEAR:\nBlow, winds, and crack your cheeks! rage! blow! You cataracts and hurricanoes, spout"
        first, again = (ask(long) for _ in range(2))
        assert first["tinyllm"]["cached_tokens"] == 0 and again["tinyllm"]["cached_tokens"] >= 16
        s.engine_loop.call(check_invariants, timeout=30)
