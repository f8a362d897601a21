"""tinyllm serve --slo: /metrics counts finished requests that met the SLO and those that missed
it (by the reason they waited most), under tinyllm's own names beside vLLM's; nothing without it."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import SERVED_MODEL, random_model
from tinyllm.model.checkpoint import load_checkpoint
from tinyllm.serve import EngineLoop, ServerThread, build_engine, create_app
from tinyllm.slo import SLO


def scrape(client) -> dict:
    r = client.get("/metrics")
    assert r.status_code == 200
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(r.text)
        for s in fam.samples
    }


def test_metrics_count_a_met_and_a_missed_request():
    """One token (no time per output token to miss) meets the SLO; six tokens against a TPOT no
    step can meet (1 µs) miss it, whatever the machine's speed."""
    _, tok = load_checkpoint(device="cpu")
    model = random_model(seed=0, vocab=tok.vocab_size, d_model=32, n_layers=1, max_seq_len=128)
    slo = SLO.parse("ttft=1000s,tpot=0.001ms")
    app = create_app(EngineLoop(build_engine(model, slots=2)), tok, SERVED_MODEL, slo=slo)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        for n in (1, 6):
            r = client.post(
                "/v1/completions",
                json={"model": SERVED_MODEL, "prompt": "ROMEO:", "max_tokens": n, "temperature": 0, "ignore_eos": True},
            )
            assert r.status_code == 200, r.text
        m = scrape(client)
    met = m[("tinyllm:requests_slo_met_total", frozenset({"model_name": SERVED_MODEL}.items()))]
    missed = {
        dict(labels)["reason"]: v for (name, labels), v in m.items() if name == "tinyllm:requests_slo_missed_total"
    }
    assert met == 1 and sum(missed.values()) == 1 and set(missed) <= {"none", "queue", "slots", "pool", "budget"}
    assert (
        m[("vllm:request_success_total", frozenset({"model_name": SERVED_MODEL, "finished_reason": "length"}.items()))]
        == 2
    )


def test_no_slo_no_slo_counters():
    _, tok = load_checkpoint(device="cpu")
    model = random_model(seed=0, vocab=tok.vocab_size, d_model=32, n_layers=1, max_seq_len=128)
    app = create_app(EngineLoop(build_engine(model, slots=2)), tok, SERVED_MODEL)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        assert "tinyllm:requests_slo" not in client.get("/metrics").text
