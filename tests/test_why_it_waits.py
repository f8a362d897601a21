"""Why each request waits (issue 23), everywhere it is shown: the timeline (a glyph per reason),
the request pane, the event log and status line (the policy), the Perfetto export, recordings
(replay shows it), and the server (priority / tenant in, wait counts in the state stream)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.helpers import chunked_engine, engine_held, random_model
from tests.screen_check import check_panels
from tests.test_app import _watch, bundled, no_unexpected_errors, step, submit, until, watched_app  # noqa: F401
from tinyllm.engine import ContinuousEngine, Request
from tinyllm.observe.recording import SnapshotDecoder, SnapshotEncoder, encode_event, make_header
from tinyllm.observe.timeline import build_tracks
from tinyllm.observe.trace import perfetto_trace
from tinyllm.serve import EngineLoop, ServerThread, build_engine, create_app
from tui.app import TinyLLMApp
from tui.widgets.event_log import EventLog
from tui.widgets.timeline import WAIT_CELLS, paint


@pytest.fixture(scope="module")
def model():
    return random_model(seed=5, vocab=64, d_model=32, n_layers=2, max_seq_len=64)


def tight_engine(model) -> ContinuousEngine:
    """5 blocks of 4 tokens: the first request holds them all, the second waits for the pool."""
    return chunked_engine(model, 2, 20, block_size=4, budget=32, kv_blocks=5, prefix_cache=False)


def test_the_timeline_shows_each_reason_with_its_own_glyph(model):
    eng = tight_engine(model)
    eng.add_request(Request([1] * 18, 2))
    b = eng.add_request(Request([2] * 10, 2))
    events = []
    while eng.has_work():
        eng.step()
        events += eng.pop_lifecycle()
    track = next(t for t in build_tracks(events) if t.rid == b)
    pool = [(s, e) for s, e, code in track.wait_spans(eng.steps) if code == "pool"]
    assert pool and pool[0][0] == 1  # from its first step on
    first, last = pool[0]
    cells = paint(track, 1, eng.steps, 1, eng.steps)
    assert [c[0] for c in cells[first - 1 : last]] == [WAIT_CELLS["pool"][0]] * (last - first + 1)
    admitted = next(s for s, _ in track.admissions)
    assert admitted == last + 1  # it waited until the step it got in


def record(eng: ContinuousEngine, steps: int | None = None) -> tuple[dict, list[dict]]:
    """A recording of ``eng`` run to the end, as (header, records)."""
    header = make_header(eng.snapshot(), "test", "test", {})
    enc = SnapshotEncoder(header)
    records = []
    while eng.has_work():
        eng.step()
        records.append(
            {
                "step": eng.steps,
                "snap": enc.encode(eng.snapshot()),
                "life": [encode_event(e) for e in eng.pop_lifecycle()],
            }
        )
    return header, records


def test_recordings_and_the_perfetto_export_carry_the_reasons_and_each_steps_batch(model):
    eng = tight_engine(model)
    eng.add_request(Request([1] * 18, 2))
    b = eng.add_request(Request([2] * 10, 2))
    eng.step()
    want = eng.snapshot()
    eng2 = tight_engine(model)
    eng2.add_request(Request([1] * 18, 2))
    eng2.add_request(Request([2] * 10, 2))
    header, records = record(eng2)
    dec = SnapshotDecoder(header)
    first = dec.apply(records[0]["snap"])
    v = first.request(b)
    assert (
        (v.wait, v.wait_detail)
        == (want.request(b).wait, want.request(b).wait_detail)
        == ("pool", "KV pool full: needs 3 blocks, 0 free")
    )
    assert first.batch == want.batch == ((0, 18),)
    assert header["engine"]["policy"] == "fcfs"
    trace = perfetto_trace(header, records)["traceEvents"]
    queued = [e for e in trace if e.get("ph") == "X" and e.get("tid") == b + 1 and e["name"] == "queued"]
    assert queued and queued[0]["args"]["waiting"].startswith("pool (steps 1..")
    instants = [e for e in trace if e.get("ph") == "i" and e["name"] == "waiting"]
    assert any(e["args"]["reason"] == "pool: KV pool full: needs 3 blocks, 0 free" for e in instants)


def waiting_app(policy: str = "fcfs") -> TinyLLMApp:
    model, tok = bundled()
    eng = chunked_engine(model, 2, 128, block_size=8, budget=16, seeded=True, kv_blocks=16, scheduling_policy=policy)
    return watched_app(eng, tok, 20)


async def test_the_pane_says_why_the_selected_request_waits_and_the_status_names_the_policy():
    app = waiting_app("shortest-first")
    async with app.run_test(size=(120, 40)) as pilot:
        long = await submit(pilot, "ROMEO:\n" * 12)  # the longest job: both short ones go first
        await submit(pilot, "JULIET:\n")
        await submit(pilot, "HAMLET:\n")
        await step(pilot, 1)
        await until(pilot, lambda: app.runner.frame.snapshot.counters.steps == 1)
        app.refresh_from_runner(force=True)
        await pilot.pause()
        snap = app.runner.frame.snapshot
        assert "shortest-first" in app.query_one("#status").text.plain
        waiting = snap.request(long)
        assert (waiting.state, waiting.wait, waiting.wait_detail) == (
            "queued",
            "slots",
            "all 2 slots busy (max running sequences: 2)",
        )
        app.select(waiting.rid)
        app.refresh_from_runner(force=True)
        await pilot.pause()
        body = app.query_one("#pane-body").render().plain
        assert f"step 1: waiting: {waiting.wait_detail}" in body
        ran = next(rid for rid, _ in snap.batch)
        app.select(ran)
        app.refresh_from_runner(force=True)
        await pilot.pause()
        n = dict(snap.batch)[ran]
        assert f"step 1: in the batch, {n} token" in app.query_one("#pane-body").render().plain
        check_panels(app)


async def test_the_event_log_says_when_a_request_starts_waiting_for_the_pool():
    model, tok = bundled()
    eng = chunked_engine(model, 2, 64, block_size=8, budget=64, seeded=True, kv_blocks=7, prefix_cache=False)
    app = watched_app(eng, tok, 1)
    async with app.run_test(size=(120, 40)) as pilot:
        await submit(pilot, "ROMEO:\n" * 11)  # 55 tokens: all 7 blocks of 8
        b = await submit(pilot, "JULIET:\n" * 4)
        await step(pilot, 1)
        app.refresh_from_runner(force=True)
        await pilot.pause()
        v = app.runner.frame.snapshot.request(b)
        assert v.wait == "pool"
        log = [e.text for e in app.query_one(EventLog).lines]
        assert f"#{b} waits: {v.wait_detail}" in log
        await pilot.resize_terminal(100, 40)  # narrower than the line: it wraps, whole
        line = f"{0:>6} #{b} waits: {v.wait_detail}"  # (the step column, then its text)
        await until(pilot, lambda: 0 < app.query_one(EventLog).content_region.width < len(line), what="the resize")
        await pilot.pause()
        log = app.query_one(EventLog)
        options = app.console.options.update_width(log.content_region.width)
        drawn = app.console.render_lines(log.render(), options, pad=False)  # as the screen draws it
        shown = " ".join("".join(seg.text for seg in line).strip() for line in drawn).split()
        shown = " ".join(shown)
        assert f"#{b} waits: {v.wait_detail}" in shown and "…" not in shown


SLOTS = 1


@pytest.fixture(scope="module")
def server():
    """One slot, and steps of at least 10 ms: a 30-token request runs 0.3 s or more, so requests
    posted 50 ms apart find the slot taken and wait, however fast the machine."""
    model, tok = bundled()
    loop = EngineLoop(
        build_engine(model, slots=SLOTS, scheduling_policy="priority"), on_step=lambda *_: time.sleep(0.01)
    )
    s = ServerThread(create_app(loop, tok, "m")).start()
    yield s
    s.stop()


def test_the_server_takes_priority_and_user_and_counts_waits_in_its_stream(server):
    seen: list[dict] = []
    done = threading.Event()

    def watch():
        with httpx.stream("GET", server.url + "/v1/tinyllm/stream", timeout=60) as r:
            for line in r.iter_lines():
                seen.append(json.loads(line))
                if done.is_set():
                    return

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not seen:  # the header: the stream is subscribed before it sends it, so it sees them all
        assert time.monotonic() < deadline, "the state stream sent no header"
        time.sleep(0.01)
    body = {"prompt": "ROMEO:", "max_tokens": 30, "ignore_eos": True}
    bodies = [dict(body, priority=3, user="batch-job"), dict(body, priority=-1), dict(body, priority=-1)]
    results: list = [None] * len(bodies)

    def post(i: int) -> None:
        results[i] = httpx.post(server.url + "/v1/completions", json=bodies[i], timeout=120)

    posts = [threading.Thread(target=post, args=(i,)) for i in range(len(bodies))]
    with engine_held(server.engine_loop, waiting=len(bodies)):  # all three wait together, then run
        for p in posts:
            p.start()
    for p in posts:
        p.join(120)
    assert all(r is not None and r.status_code == 200 for r in results)
    done.set()
    t.join(10)
    views = {}
    for rec in seen[1:]:
        for rid, fs in rec.get("snap", {}).get("r", {}).items():
            if isinstance(fs, dict) and "priority" in fs:
                views[int(rid)] = fs
    assert {(fs["priority"], fs["tenant"]) for fs in views.values()} >= {(3, "batch-job"), (-1, "")}
    counts = [rec["x"]["waits"] for rec in seen if "waits" in rec.get("x", {})]
    assert any(c.get("slots") or c.get("queue") or c.get("preempted") for c in counts)
    assert seen[0]["engine"]["policy"] == "priority"


@pytest.mark.parametrize(
    "value, message",
    [
        ("high", "priority must be an integer"),
        (2**40, "priority must be an integer in"),
        (True, "priority must be an integer"),
    ],
)
def test_a_bad_priority_is_a_400_naming_it(server, value, message):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "A", "max_tokens": 2, "priority": value}, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "priority" and message in err["message"]


def test_a_long_or_odd_user_is_a_stable_tenant_and_an_api_key_is_one_too(server):
    from tinyllm.serve.protocol import api_key_tenant, tenant_of

    assert tenant_of("x" * 500, "user") == tenant_of("x" * 500, "user") != tenant_of("y" * 500, "user")
    assert len(tenant_of("x" * 500, "user")) <= 64 and tenant_of("a\nb", "user").startswith("user:")
    assert api_key_tenant("Bearer sk-123") == api_key_tenant("Bearer sk-123") != api_key_tenant("Bearer sk-456")
    assert "sk-123" not in api_key_tenant("Bearer sk-123") and api_key_tenant(None) == ""
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "A", "max_tokens": 2, "user": 5}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "user"
