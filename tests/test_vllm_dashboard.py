"""vLLM's own Grafana dashboard works on `tinyllm serve`.

``tests/data/vllm-grafana-dashboard.json`` is vLLM's dashboard,
``examples/observability/prometheus_grafana/grafana.json`` of https://github.com/vllm-project/vllm
at commit 4b5c627c23e6690b8987100d1cbf78e34ac14bf9 (Apache License 2.0, copyright the vLLM
project's contributors), trimmed to the panels' queries and the template variables (its
``_tinyllm_note`` says what was left out; every expression is verbatim).

The test parses every PromQL expression in it, takes each metric selector (``vllm:...``) with its
label matchers and the labels its aggregations group by, substitutes the dashboard's
``$model_name`` variable the way Grafana would (``label_values(model_name)``), and checks that
our ``/metrics``, after serving a few requests, has a series for each selector carrying those
labels, and that the series mean what vLLM means (counts that match what was served).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tinyllm.model.checkpoint import load_checkpoint
from tinyllm.serve import EngineLoop, ServerThread, build_engine, create_app

DASHBOARD = Path(__file__).parent / "data" / "vllm-grafana-dashboard.json"
MODEL = "tinyllm-shakespeare"
FUNCTIONS_OR_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
    "unless",
}
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[[^\]]*\]|[A-Za-z_:][A-Za-z0-9_:]*|\{|\}|\(|\)|[^\s]')
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')


def selectors(expr: str) -> tuple[list[tuple[str, list[tuple[str, str, str]]]], set[str]]:
    """The metric selectors of a PromQL expression, each (name, [(label, op, value)]), and the
    labels its ``by (...)`` clauses group on. A name followed by ``(`` (or ``by``) is a function."""
    toks = _TOKEN.findall(expr)
    out, grouped, i = [], set(), 0
    while i < len(toks):
        t = toks[i]
        if t in ("by", "without") and i + 1 < len(toks) and toks[i + 1] == "(":
            j = toks.index(")", i)
            grouped |= {x for x in toks[i + 2 : j] if x != ","}
            i = j + 1
            continue
        if re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", t) and t not in FUNCTIONS_OR_KEYWORDS:
            nxt = toks[i + 1] if i + 1 < len(toks) else ""
            if nxt in ("(", "by", "without"):  # a function, or an aggregation
                i += 1
                continue
            matchers = []
            if nxt == "{":
                j = toks.index("}", i)
                body = "".join(toks[i + 2 : j])  # strings are whole tokens: no "}" inside
                matchers = [(m.group(1), m.group(2), m.group(3)) for m in _MATCHER.finditer(body)]
                i = j
            out.append((t, matchers))
        i += 1
    return out, grouped


def dashboard_queries() -> list[str]:
    d = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in d["panels"] for t in p.get("targets", []) if t.get("expr")]


def check_against(samples: list, expr: str, variables: dict[str, str]) -> list[str]:
    """What ``expr`` selects that ``samples`` (prometheus_client samples) lack: one line each."""
    missing = []
    sels, grouped = selectors(expr)
    for name, matchers in sels:

        def ok(s) -> bool:
            for label, op, value in matchers:
                value = re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), m.group(0)), value)
                got = s.labels.get(label)
                if op == "=" and got != value or op == "!=" and got == value:
                    return False
                if op in ("=~", "!~") and (got is not None and re.fullmatch(value, got) is not None) != (op == "=~"):
                    return False
            return True

        hits = [s for s in samples if s.name == name and ok(s)]
        if not hits:
            missing.append(f"{name}{matchers}: no series")
        for label in grouped:
            if hits and not all(label in s.labels for s in hits):
                missing.append(f"{name}: series without the label {label!r} it is grouped by")
    return missing


def test_the_parser_reads_every_query_of_the_dashboard():
    queries = dashboard_queries()
    assert len(queries) == 27
    names = {n for q in queries for n, _ in selectors(q)[0]}
    assert names == {
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_sum",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:inter_token_latency_seconds_sum",
        "vllm:inter_token_latency_seconds_count",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_sum",
        "vllm:time_to_first_token_seconds_count",
        "vllm:kv_cache_usage_perc",
        "vllm:request_prompt_tokens_bucket",
        "vllm:request_generation_tokens_bucket",
        "vllm:request_success_total",
        "vllm:request_queue_time_seconds_sum",
        "vllm:request_prefill_time_seconds_sum",
        "vllm:request_decode_time_seconds_sum",
        "vllm:request_max_num_generation_tokens_sum",
    }
    assert all(m == [("model_name", "=", "$model_name")] for q in queries for _, m in selectors(q)[0])
    assert selectors(queries[0])[1] == {"le"}
    assert selectors('sum by(finished_reason) (increase(vllm:request_success_total{a="1", b=~"x|y"}[5m]))') == (
        [("vllm:request_success_total", [("a", "=", "1"), ("b", "=~", "x|y")])],
        {"finished_reason"},
    )


def test_the_check_finds_what_is_missing():
    """The checker itself: a metric we lack, a label value we lack, a grouping label we lack."""
    fams = '# TYPE vllm:x counter\nvllm:x_total{model_name="m"} 1.0\n'
    samples = [s for f in text_string_to_metric_families(fams) for s in f.samples]
    assert check_against(samples, 'rate(vllm:x_total{model_name="$model_name"}[1m])', {"model_name": "m"}) == []
    assert check_against(samples, 'vllm:num_requests_swapped{model_name="m"}', {})
    assert check_against(samples, 'vllm:x_total{model_name="other"}', {})
    assert check_against(samples, 'sum by(le) (vllm:x_total{model_name="m"})', {})


@pytest.fixture(scope="module")
def served_metrics():
    """/metrics of a server that served 3 completions, 1 chat and 1 aborted stream. (Steps take
    10 ms at least: the 200-token stream runs 2 s or more, so the hang-up ends it first however
    fast the machine.)"""
    model, tok = load_checkpoint(device="cpu")
    loop = EngineLoop(build_engine(model, slots=4), on_step=lambda *_: time.sleep(0.01))
    with ServerThread(create_app(loop, tok, MODEL)) as s:
        with httpx.Client(base_url=s.url, timeout=60) as c:
            for p in ("ROMEO:\n", "JULIET:\n", "HAMLET:\n"):
                r = c.post("/v1/completions", json={"prompt": p, "max_tokens": 6, "ignore_eos": True})
                assert r.status_code == 200
            assert (
                c.post(
                    "/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "ignore_eos": True},
                ).status_code
                == 200
            )
            with c.stream(
                "POST",
                "/v1/completions",
                json={"prompt": "IAGO:\n", "max_tokens": 200, "stream": True, "ignore_eos": True},
            ) as r:
                next(r.iter_lines())  # one chunk, then hang up
            deadline = time.monotonic() + 60
            while True:  # the abort lands a step or two later
                samples = [x for f in text_string_to_metric_families(c.get("/metrics").text) for x in f.samples]
                if any(
                    x.name == "vllm:request_success_total"
                    and x.labels.get("finished_reason") == "abort"
                    and x.value == 1
                    for x in samples
                ):
                    return samples
                assert time.monotonic() < deadline, "the hung-up stream was never counted as aborted"
                time.sleep(0.05)


def test_every_dashboard_query_finds_its_series(served_metrics):
    variables = {"model_name": next(s.labels["model_name"] for s in served_metrics if "model_name" in s.labels)}
    assert variables["model_name"] == MODEL  # label_values(model_name): the dashboard's variable
    missing = [f"{q!r}: {m}" for q in dashboard_queries() for m in check_against(served_metrics, q, variables)]
    assert missing == []


def test_the_series_mean_what_vllm_means(served_metrics):
    def value(name, **labels):
        return next(s.value for s in served_metrics if s.name == name and labels.items() <= s.labels.items())

    finished = 4  # 3 completions + 1 chat ran to max_tokens
    for h in (
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:request_max_num_generation_tokens",
        "vllm:e2e_request_latency_seconds",
    ):
        assert value(h + "_count") == finished, h
    assert value("vllm:request_generation_tokens_sum") == 3 * 6 + 4
    assert value("vllm:request_max_num_generation_tokens_sum") == 3 * 6 + 4
    assert value("vllm:request_success_total", finished_reason="length") == finished
    assert value("vllm:request_success_total", finished_reason="abort") == 1
    assert value("vllm:request_inference_time_seconds_sum") == pytest.approx(
        value("vllm:request_prefill_time_seconds_sum") + value("vllm:request_decode_time_seconds_sum"), abs=1e-6
    )
    assert value("vllm:request_prompt_tokens_bucket", le="+Inf") == finished
