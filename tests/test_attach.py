"""tinyllm-tui --attach against a real `tinyllm serve` on 127.0.0.1 (in-process, a free port).

The state stream is a live recording: what a viewer rebuilds equals the engine's own snapshot;
prompts typed in the app stream from the server; aborts reach the engine; two viewers see the
same engine; a server that goes away shows as disconnected and the viewer reconnects."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import httpx
import pytest

from tests.helpers import SERVED_MODEL, serve_in_thread
from tests.screen_check import check_panels
from tests.test_app import _watch, bundled, no_unexpected_errors, submit, until  # noqa: F401
from tinyllm.engine import Request
from tinyllm.engine.solo import generate
from tinyllm.observe.recording import read_recording
from tinyllm.request import RequestSettings, Sampling
from tinyllm.serve import EngineLoop, ServerThread, build_engine, create_app
from tui.app import TinyLLMApp
from tui.cli import build_app
from tui.runners.attach import AttachRunner
from tui.runners.interface import Abort, Submit
from tui.runners.replay import ReplayRunner
from tui.screens.modals import Confirm
from tui.widgets.kv_panel import KVPanel
from tui.widgets.request_list import RequestList

MODEL = SERVED_MODEL


def start_server(port: int = 0, slots: int = 3) -> ServerThread:
    return serve_in_thread(*bundled(), slots=slots, port=port, max_len=256)


def engine_snapshot(server: ServerThread):
    return server.engine_loop.call(lambda e: e.snapshot())


def state(snap):
    """A snapshot without its clock (taking a snapshot stamps it with the time it was taken)."""
    return replace(snap, time_s=0.0)


def attach_app(url: str, new: int = 16) -> TinyLLMApp:
    app = TinyLLMApp(AttachRunner(url).start(), None, model_name=MODEL, settings=RequestSettings(Sampling(), new))
    _watch(app)
    return app


def idle(server: ServerThread) -> bool:
    snap = engine_snapshot(server)
    return not snap.queue and snap.num_requests_running == 0


@pytest.fixture
def server():
    s = start_server()
    yield s
    s.stop()


async def test_attached_app_streams_a_typed_prompt_and_sees_the_servers_state(server):
    model, tok = bundled()
    app = attach_app(server.url)
    async with app.run_test(size=(120, 40)) as pilot:
        await submit(pilot, "ROMEO:\n")
        await until(pilot, lambda: app.runner.frame.snapshot.counters.finished == 1, what="the completion")
        await until(
            pilot, lambda: state(app.runner.frame.snapshot) == state(engine_snapshot(server)), what="the last state"
        )
        frame = app.runner.frame
        view = frame.snapshot.requests[0]
        want = generate(model, tok.encode("ROMEO:\n"), 16, eos_id=tok.eos_id)
        assert list(view.tokens) == want  # greedy, as solo generate()
        assert frame.texts[0] == tok.decode(want, skip_special_tokens=True) and frame.prompts[0] == "ROMEO:\n"
        assert [t.end for t in frame.tracks] == ["finished"]
        status = app.query_one("#status").text.plain
        assert "ATTACHED" in status and server.url in status
        assert any("#0 admitted to slot" in e.text for e in frame.log)
        for action in ("toggle_pause", "step_once", "slower", "faster", "clear_prefix_cache", "step_back"):
            assert app.check_action(action, ()) is False  # the server paces itself
        app.query_one("#requests").focus()
        await pilot.press("space", "n", "plus")  # off: nothing happens, no error
        await pilot.pause(0.1)


LONG = 480  # tokens of a slow server's requests (ignoring the end of text): 14 s at least


def slow_server(port: int = 0, slots: int = 3) -> ServerThread:
    """A server whose steps take at least 30 ms, for requests of LONG tokens that ignore the end
    of text: they run 14 s at least, whatever the machine's speed, so a test can abort them while
    they run (at 200 tokens, 6 s, a busy machine's key presses and calls could outlast them)."""
    model, tok = bundled()
    loop = EngineLoop(build_engine(model, slots=slots, max_len=512), on_step=lambda *_: time.sleep(0.03))
    return ServerThread(create_app(loop, tok, MODEL), port=port).start()


@pytest.fixture
def slow():
    s = slow_server()
    yield s
    s.stop()


def long_app(url: str) -> TinyLLMApp:
    app = TinyLLMApp(
        AttachRunner(url).start(), None, model_name=MODEL, settings=RequestSettings(Sampling(), LONG, stop_at_eos=False)
    )
    _watch(app)
    return app


def other_client(url: str, prompt: str = "KING:") -> threading.Thread:
    """Another client's long streaming request (it ends when aborted or when the server stops)."""

    def run() -> None:
        try:
            with httpx.stream(
                "POST",
                url + "/v1/completions",
                timeout=60,
                json={"prompt": prompt, "max_tokens": LONG, "ignore_eos": True, "stream": True},
            ) as r:
                for _ in r.iter_lines():
                    pass
        except httpx.HTTPError:
            pass

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


async def ours_and_another(pilot) -> tuple[int, int]:
    """(our request, another client's), both running."""
    app = pilot.app
    await submit(pilot, "HAMLET:\n")
    other_client(app.runner.url)
    await until(pilot, lambda: len(app.runner.frame.snapshot.requests) == 2)
    await until(
        pilot,
        lambda: all(v.state == "running" for v in app.runner.frame.snapshot.requests) and len(app.runner.ours()) == 1,
        what="both running",
    )
    ours = next(iter(app.runner.ours()))
    return ours, next(v.rid for v in app.runner.frame.snapshot.requests if v.rid != ours)


async def asked(pilot, *keys: str) -> str:
    """Press ``keys``; the app must ask first: the question's text."""
    await pilot.press(*keys)
    await until(pilot, lambda: isinstance(pilot.app.screen, Confirm), what="the question")
    return pilot.app.screen.query_one("#confirm-message").render().plain


async def test_abort_from_the_app_ours_and_another_clients(slow):
    """x aborts ours at once; another client's request only after a yes (Esc keeps it)."""
    app = long_app(slow.url)
    async with app.run_test(size=(120, 40)) as pilot:
        ours, theirs = await ours_and_another(pilot)
        counters = app.query_one(KVPanel).render().plain
        assert "step —" in counters and "0.0ms" not in counters  # the server's stream has no step time
        app.select(ours)
        await pilot.press("escape", "x")
        await until(pilot, lambda: app.runner.frame.snapshot.request(ours).state == "aborted", what="ours aborted")
        app.select(theirs)
        question = await asked(pilot, "x")  # what its client gets: test_serve_security's abort test
        assert "another client" in question and "its client gets the text so far, with finish_reason abort" in question
        await pilot.press("escape")
        await pilot.pause(0.3)
        assert app.runner.frame.snapshot.request(theirs).state == "running"
        await asked(pilot, "x")
        await pilot.press("y")
        await until(pilot, lambda: app.runner.frame.snapshot.request(theirs).state == "aborted", what="theirs aborted")
        await until(pilot, lambda: idle(slow))
        snap = engine_snapshot(slow)
        assert snap.kv.allocated_tokens == 0 and [v.state for v in snap.requests] == ["aborted", "aborted"]


async def test_abort_all_from_a_viewer_asks_and_can_spare_other_clients(slow):
    """^k attached: a question saying how many requests are other clients'; o aborts ours only."""
    app = long_app(slow.url)
    async with app.run_test(size=(120, 40)) as pilot:
        ours, theirs = await ours_and_another(pilot)
        question = await asked(pilot, "escape", "ctrl+k")
        assert "1 from this app, 1 from other clients (each of those gets its text so far" in question
        await pilot.press("o")
        await until(pilot, lambda: app.runner.frame.snapshot.request(ours).state == "aborted", what="ours aborted")
        await pilot.pause(0.3)
        assert app.runner.frame.snapshot.request(theirs).state == "running"
        await asked(pilot, "ctrl+k")
        await pilot.press("a")
        await until(pilot, lambda: app.runner.frame.snapshot.request(theirs).state == "aborted", what="theirs aborted")
        check_panels(app)


async def test_two_viewers_see_the_same_engine(server):
    a, b = AttachRunner(server.url).start(), AttachRunner(server.url).start()
    threads = [threading.Thread(target=r.run, daemon=True) for r in (a, b)]
    for t in threads:
        t.start()
    try:
        for prompt in ("JULIET:", "ROMEO:", "NURSE:"):
            r = httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 12}, timeout=60)
            assert r.status_code == 200
        want = state(engine_snapshot(server))
        deadline = time.monotonic() + 20
        while not (state(a.frame.snapshot) == want == state(b.frame.snapshot)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert state(a.frame.snapshot) == want == state(b.frame.snapshot)
        assert a.frame.texts == b.frame.texts and len(a.frame.texts) == 3
    finally:
        a.stop()
        b.stop()


async def follow(pilot, cond, what: str, timeout: float = 30.0) -> int:
    """Wait for ``cond``, drawing and checking every panel at each new frame on the way; it
    holds once the frame it holds on is the one drawn (a frame published after the draw waits
    for its own: the panels were a frame behind the runner's status)."""
    app, seen, checked = pilot.app, -1, 0
    end = time.monotonic() + timeout
    while True:
        if app.runner.frame.seq != seen:
            app.refresh_from_runner(force=True)
            await pilot.pause()
            # the frame the app drew (the runner may have published another since it was read,
            # and the app's own tick may have drawn it): every panel must show that one
            seen = check_panels(app).seq
            checked += 1
        if app.runner.frame.seq == seen and cond():
            return checked
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await pilot.pause(0.02)


async def test_a_server_that_goes_away_is_shown_and_the_viewer_reconnects():
    """Through a restart every panel is checked at every frame: after the reconnect the dead
    server's requests are gone from the list, and the new server's #0 is its own."""
    s = start_server()
    port = int(s.url.rsplit(":", 1)[1])
    for prompt in ("JULIET:", "ROMEO:"):
        assert (
            httpx.post(s.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 6}, timeout=60).status_code
            == 200
        )
    app = attach_app(s.url)
    async with app.run_test(size=(120, 40)) as pilot:
        await follow(pilot, lambda: app.query_one(RequestList).rids == (0, 1), "the old server's requests")
        s.stop()
        await follow(pilot, lambda: "DISCONNECTED" in app.query_one("#status").text.plain, "the disconnect")
        assert app.query_one(RequestList).rids == (0, 1)  # the last state, said to be so
        s = start_server(port)  # back on the same address
        try:
            await follow(pilot, lambda: app.runner.frame.status == "ready", "the reconnect")
            assert app.query_one(RequestList).rids == () and app.selected is None
            await submit(pilot, "To be")
            await follow(pilot, lambda: app.runner.frame.snapshot.counters.finished == 1, "the new #0")
            assert app.query_one(RequestList).rids == (0,) and app.runner.frame.prompts[0] == "To be"
            assert app.query_one("#pane-header").text.plain.startswith("#0 finished")
            assert any("reconnected" in e.text for e in app.runner.frame.log)
        finally:
            s.stop()


@pytest.mark.expect_errors("request refused")
async def test_a_prompt_the_server_refuses_comes_back_to_the_input(server):
    """Attached without a tokenizer the server checks the prompt: one too long for its context
    was refused and lost (the input is cleared on sending); it comes back, to be edited, as a
    local app keeps it."""
    app = attach_app(server.url)
    long = "to be or not to be " * 120  # ~700 tokens; the server's context: 256
    async with app.run_test(size=(120, 40)) as pilot:
        await follow(pilot, lambda: app.runner.frame.status == "ready", "the connection")
        app.query_one("#prompt").focus()
        app.query_one("#prompt").value = long
        await pilot.press("enter")
        await until(pilot, lambda: app.query_one("#prompt").value == long, what="the prompt back in the input")
        await until(pilot, lambda: app.notified)
        assert any("request refused" in text and "context" in text for _, _, text in app.notified)
        assert not app.runner.frame.snapshot.requests  # nothing ran


@pytest.mark.expect_errors("not sent")
async def test_a_prompt_typed_while_disconnected_stays_in_the_input():
    """Enter while the server is away sends nothing and keeps the text (it was cleared, then
    failed with a raw ConnectError: the prompt was lost); the status keeps the server's address
    and counts down to the next try, with no separator left alone."""
    s = start_server()
    app = attach_app(s.url)
    async with app.run_test(size=(120, 40)) as pilot:
        await follow(pilot, lambda: app.runner.frame.status == "ready", "the connection")
        s.stop()
        await follow(pilot, lambda: "retry in" in app.runner.frame.status, "the countdown")
        status = app.query_one("#status").text.plain
        assert status.startswith(" ✗ DISCONNECTED  tinyllm serve at " + s.url) and "  ·" not in status
        assert "retry in" in status and "last state shown" in status
        await pilot.press("i")
        app.query_one("#prompt").value = "ROMEO:"
        await pilot.press("enter")
        await until(pilot, lambda: app.notified)
        assert [(sev, title) for sev, title, _ in app.notified] == [("error", "not sent")]
        assert s.url in app.notified[0][2] and app.query_one("#prompt").value == "ROMEO:"
        await pilot.pause(0.2)
        assert not any("request failed" in e.text for e in app.runner.frame.log)


def test_the_disconnected_status_line_gives_way_without_a_separator_alone():
    """Narrow, the address gives way before the countdown; what follows the badge never starts
    with a separator of its own."""
    from types import SimpleNamespace

    from tui.widgets.status import fit_fields, status_fields

    snap = SimpleNamespace(counters=SimpleNamespace(steps=148))
    frame = SimpleNamespace(status="disconnected: retry in 3 s", snapshot=snap)
    runner = SimpleNamespace(mode="attach", kind="tinyllm serve", url="http://127.0.0.1:8765")
    fields = status_fields(frame, runner, "shakespeare")
    wide = fit_fields(fields, 200).plain
    assert wide.startswith(
        " ✗ DISCONNECTED  tinyllm serve at http://127.0.0.1:8765 · shakespeare · step 148 · retry in 3 s"
    )
    for width in (30, 40, 60, 80):
        line = fit_fields(fields, width).plain
        assert "step 148" in line and "  ·" not in line and "DISCONNECTED · " not in line, (width, line)
    assert "retry in 3 s · last state shown" in fit_fields(fields, 80).plain  # before the address
    assert "127.0.0.1:8765" in fit_fields(fields, 100).plain


def test_the_state_stream_is_a_recording_that_replays(server, tmp_path):
    """curl -N URL/v1/tinyllm/stream > run.jsonl: a file --replay plays."""
    path = tmp_path / "run.jsonl"
    lines: list[str] = []
    started = threading.Event()

    def watch():
        with httpx.stream("GET", server.url + "/v1/tinyllm/stream", timeout=30) as r:
            for line in r.iter_lines():
                lines.append(line)
                started.set()  # the header: the stream is subscribed before it sends it
                rec = json.loads(line)
                if rec.get("snap", {}).get("c") and any(e[0] == "finished" for e in rec.get("life", ())):
                    return

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    assert started.wait(30), "the state stream sent no header"
    assert httpx.post(
        server.url + "/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 10}, timeout=60
    ).is_success
    t.join(30)
    path.write_text("\n".join(lines) + "\n")
    header, records, warning = read_recording(path)
    assert header["model"] == MODEL and warning is None and header["settings"]["kv"] == "paged"
    replay = ReplayRunner(path, paused=True)
    from tui.runners.interface import SeekStep

    replay.apply(SeekStep(replay.last_step))
    assert state(replay.frame.snapshot) == state(engine_snapshot(server))


@pytest.mark.parametrize("body, status", [({"rid": "x"}, 400), ({}, 400), ({"rid": 99}, 200)])
def test_operator_abort_checks_its_input(server, body, status):
    r = httpx.post(server.url + "/v1/tinyllm/abort", json=body)
    assert r.status_code == status
    if status == 400:
        assert r.json()["error"]["param"] == "rid"
    else:
        assert r.json() == {"rid": 99, "aborted": False}


@pytest.mark.parametrize("body", [{"rids": []}, {"rids": "1"}, {"rids": [1, "x"]}, {"rids": [True]}])
def test_operator_abort_of_several_checks_its_input(server, body):
    r = httpx.post(server.url + "/v1/tinyllm/abort", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "rids"


def test_abort_all_from_a_viewer_is_one_call_that_ends_them_in_the_same_step(slow):
    """^k aborted other clients' requests one POST at a time: 8 of them ran on for ~80 steps.
    Now one POST {"rids": [...]}: the engine ends them all in one call, between two steps. (The
    three LONG-token requests run 14 s at least, whatever the machine's speed: slow_server.)"""
    server = slow
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json={"rids": sent[-1]["rids"], "aborted": [True] * len(sent[-1]["rids"])})

    viewer = AttachRunner("http://tinyllm.test", client=httpx.Client(transport=httpx.MockTransport(handler)))
    viewer._abort_all([4, 5, 6])
    assert sent == [{"rids": [4, 5, 6]}] and not [e for e in viewer._log if e.kind == "error"]
    rids = [server.engine_loop.call(lambda e: e.add_request(Request([5, 6, 7], LONG))) for _ in range(3)]
    r = httpx.post(server.url + "/v1/tinyllm/abort", json={"rids": [*rids, 999]}, timeout=30)
    assert r.status_code == 200 and r.json() == {"rids": [*rids, 999], "aborted": [True, True, True, False]}
    snap = engine_snapshot(server)
    assert [snap.request(rid).state for rid in rids] == ["aborted"] * 3


def test_attach_to_nothing_or_to_a_non_tinyllm_server_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        build_app(["--attach", "127.0.0.1:9", "--wait", "0"])  # nothing listens on port 9
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--attach http://127.0.0.1:9: cannot connect (Connection refused); is the server running?" in err
    assert "--wait S waits for one that is starting" in err and len(err.strip().splitlines()) == 1


def test_attach_waits_for_a_server_that_is_not_listening_yet_then_gives_up(capsys):
    """A vLLM server listens only once its model is loaded (a minute here): the app waits, saying
    so on stderr, and gives up after --wait seconds with one line."""
    t = time.monotonic()
    with pytest.raises(SystemExit) as e:
        build_app(["--attach", "127.0.0.1:9", "--wait", "0.3"])
    assert e.value.code == 2 and time.monotonic() - t >= 0.3
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("tinyllm-tui: waiting for a server at http://127.0.0.1:9 (Connection refused): ")
    assert err[0].endswith("s left, Ctrl+C to stop") and len(err) == 2  # said once on a pipe
    assert "--attach http://127.0.0.1:9: cannot connect (Connection refused) after waiting 0.3 s" in err[1]


def test_attach_connects_once_the_server_it_waits_for_listens(monkeypatch):
    """The server starts only after the app said it is waiting (no sleep decides the order); the
    app then attaches to it as to one that was there all along."""
    import io
    import socket

    with socket.socket() as s:  # a free port, nothing on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    waiting = threading.Event()

    class Stderr(io.StringIO):
        def write(self, text: str) -> int:
            if "waiting for a server" in text:
                waiting.set()
            return super().write(text)

    monkeypatch.setattr("sys.stderr", Stderr())
    servers = []
    starter = threading.Thread(target=lambda: waiting.wait(60) and servers.append(start_server(port)), daemon=True)
    starter.start()
    try:
        app = build_app(["--attach", f"127.0.0.1:{port}", "--wait", "120"])
        assert isinstance(app.runner, AttachRunner) and app.runner.status != "disconnected"
        assert app.runner.frame.snapshot.n_slots == 3  # the server's own grid (start_server's)
        app.runner.stop()
    finally:
        starter.join(60)
        for server in servers:
            server.stop()
    assert waiting.is_set() and servers


def test_a_long_running_server_forgets_old_requests_and_viewers_follow(monkeypatch):
    """The server keeps the newest KEEP_ENDED ended requests (memory stays flat); a viewer's
    rebuilt state drops the forgotten ones too, and still equals the engine's."""
    import tinyllm.serve.engine_loop as engine_loop

    monkeypatch.setattr(engine_loop, "KEEP_ENDED", 2)
    monkeypatch.setattr(engine_loop, "FORGET_EVERY", 1)
    s = start_server()
    viewer = AttachRunner(s.url).start()
    t = threading.Thread(target=viewer.run, daemon=True)
    t.start()
    try:
        for i in range(6):
            assert httpx.post(
                s.url + "/v1/completions", json={"prompt": f"Line {i}:", "max_tokens": 4}, timeout=60
            ).is_success
        assert httpx.post(s.url + "/v1/completions", json={"prompt": "Last:", "max_tokens": 8}, timeout=60).is_success
        want = state(engine_snapshot(s))
        assert [v.rid for v in want.requests] == [5, 6]
        deadline = time.monotonic() + 20
        while state(viewer.frame.snapshot) != want and time.monotonic() < deadline:
            time.sleep(0.05)
        assert state(viewer.frame.snapshot) == want
        assert set(viewer.frame.texts) == {5, 6}
    finally:
        viewer.stop()
        s.stop()


def test_a_server_streaming_garbage_is_shown_as_disconnected_not_a_crash():
    """A record the viewer cannot apply (wrong shape) drops the connection, says so, and retries;
    the viewer's thread lives on."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    from tinyllm.observe.recording import make_header

    model, tok = bundled()
    header = make_header(engine_snapshot_of(build_engine(model, slots=2, max_len=64)), MODEL, "x", {})

    async def stream(request):
        async def lines():
            yield json.dumps(header) + "\n"
            yield '{"step": 0}\n'
            yield '{"step": 1, "snap": {"r": []}}\n'  # JSON, but not a snapshot delta

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    server = uvicorn.Server(
        uvicorn.Config(
            Starlette(routes=[Route("/v1/tinyllm/stream", stream)]),
            host="127.0.0.1",
            port=0,
            log_level="warning",
            lifespan="off",
        )
    )
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    while not server.started:
        t.join(0.02)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    viewer = AttachRunner(url).start()
    vt = threading.Thread(target=viewer.run, daemon=True)
    vt.start()
    try:
        deadline = time.monotonic() + 10
        while not viewer.frame.status.startswith("disconnected") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert viewer.frame.status.startswith("disconnected") and vt.is_alive()
        assert any("disconnected" in e.text and "AttributeError" in e.text for e in viewer.frame.log)
    finally:
        viewer.stop()
        server.should_exit = True
        t.join(10)
        vt.join(10)
    assert not vt.is_alive()


def engine_snapshot_of(engine):
    return engine.snapshot()


def test_aborting_our_queued_request_reaches_the_server_at_once():
    """One slot, busy; our request waits in the queue (no tokens flow to notice a hang-up by):
    abort must still free it now, not when it would have got its first token. (#0 runs 14 s at
    least, whatever the machine's speed: slow_server.)"""
    s = slow_server(slots=1)
    viewer = AttachRunner(s.url).start()
    vt = threading.Thread(target=viewer.run, daemon=True)
    vt.start()
    try:

        def busy():
            body = {"prompt": "KING:", "max_tokens": LONG, "ignore_eos": True}
            httpx.post(s.url + "/v1/completions", json=body, timeout=60)

        threading.Thread(target=busy, daemon=True).start()
        deadline = time.monotonic() + 20
        while engine_snapshot(s).num_requests_running == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        viewer.send(Submit("QUEEN:", RequestSettings(Sampling(), 50, True)))
        while 1 not in viewer._ours and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine_snapshot(s).request(1).state == "queued"
        viewer.send(Abort(1))
        # a backstop only: an abort sent at once finds #0 still running (asserted below), one that
        # waited for #1's first token would come after #0 ended
        deadline = time.monotonic() + 20
        while engine_snapshot(s).request(1).state == "queued" and time.monotonic() < deadline:
            time.sleep(0.02)
        aborted_at = time.monotonic()
        assert engine_snapshot(s).request(1).state == "aborted"
        assert engine_snapshot(s).request(0).state == "running"  # the other one goes on
        while viewer.frame.snapshot.request(1).state != "aborted" and time.monotonic() < aborted_at + 4:
            time.sleep(0.02)
        assert viewer.frame.snapshot.request(1).state == "aborted"  # shown at once, no heartbeat wait
    finally:
        viewer.stop()
        s.stop()


@pytest.mark.parametrize("failures", [1, 2])
def test_an_abort_crossing_a_closed_keep_alive_connection_is_sent_again(failures):
    """The server closed the pooled connection as the abort went out (no response: seen on a busy
    machine, uvicorn closes idle keep-alive connections after 5 s): sent once more, on a fresh
    connection, without an error; a second failure in a row is an error that says so."""
    sent = []

    def server(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        if len(sent) <= failures:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        return httpx.Response(200, json={"aborted": True})

    viewer = AttachRunner("http://tinyllm.test", client=httpx.Client(transport=httpx.MockTransport(server)))
    viewer._abort(7)
    errors = [e.text for e in viewer._log if e.kind == "error"]
    assert sent == [{"rid": 7}] * min(failures + 1, 2)
    lost = "abort #7 failed: RemoteProtocolError: Server disconnected without sending a response."
    assert errors == ([] if failures == 1 else [lost])


def test_the_state_stream_shows_the_text_a_client_got_cut_at_its_stop_string(server):
    """A viewer sees a request's text as its client did: cut before the stop string that ended
    it (the engine works on tokens; the handler matched the stop and kept the tokens up to it,
    whose text runs past it), nothing held back once it ended."""
    greedy = {"prompt": "ROMEO:\n", "max_tokens": 30, "temperature": 0, "ignore_eos": True}
    full = httpx.post(server.url + "/v1/completions", json=greedy, timeout=60).json()["choices"][0]["text"]
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    texts: dict[int, str] = {}
    ended: set[int] = set()
    started = threading.Event()

    def watch() -> None:
        with httpx.stream("GET", server.url + "/v1/tinyllm/stream", timeout=60) as r:
            for line in r.iter_lines():
                started.set()
                rec = json.loads(line)
                for rid, t in rec.get("text", {}).items():
                    texts[int(rid)] = texts.get(int(rid), "") + t
                ended.update(e[1] for e in rec.get("life", ()) if e[0] == "finished")

    threading.Thread(target=watch, daemon=True).start()
    assert started.wait(30)
    r = httpx.post(server.url + "/v1/completions", json={**greedy, "stop": [stop]}, timeout=60)
    rid = int(r.headers["x-tinyllm-request-id"])
    got = r.json()["choices"][0]
    assert got["finish_reason"] == "stop" and got["text"] == full[: full.find(stop)]
    end = time.monotonic() + 30
    while rid not in ended:
        assert time.monotonic() < end, "the stream did not say the request finished"
        time.sleep(0.01)
    assert texts[rid] == got["text"]


def refusing_viewer(url: str = "http://tinyllm.test") -> AttachRunner:
    """A viewer whose every connection is refused, as with no server listening (no network used)."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    return AttachRunner(url, client=httpx.Client(transport=httpx.MockTransport(refuse)))


def counts_down(monkeypatch, viewer) -> None:
    """Run ``viewer`` (a server viewer whose server refuses every connection) for 13 s of a clock
    of its own, no sleeping, that moves a microsecond at each reading (as a real one does between
    two), and check its status says when the next try is as each second passes, and "retrying…"
    while it tries. Both viewers share the countdown (server_link.ServerLink): tests/test_attach_vllm.py
    runs this on the vLLM one."""
    from types import SimpleNamespace

    import tui.runners.server_link as server_link

    clock = [0.0]

    def now() -> float:
        clock[0] += 1e-6
        return clock[0]

    class Clocked(threading.Event):
        def wait(self, timeout=None):
            clock[0] += timeout
            if clock[0] >= 13:
                self.set()
            return self.is_set()

    monkeypatch.setattr(server_link, "time", SimpleNamespace(monotonic=now))
    viewer._stop = Clocked()
    seen: list[str] = []
    publish = viewer._publish

    def record(detail: str = "") -> None:
        publish(detail)
        if not seen or seen[-1] != viewer.frame.status:
            seen.append(viewer.frame.status)

    monkeypatch.setattr(viewer, "_publish", record)
    viewer.run()
    down = [s.removeprefix("disconnected: ") for s in seen]

    def countdown(s: int) -> list[str]:  # a wait of s seconds, then the try
        return [f"retry in {i} s" for i in range(s, 0, -1)] + ["retrying…"]

    # waits of 0.5 s (no countdown), 1, 2, 4, then 5 s (the cap); the clock stops 13 s in, during the next
    want = ["disconnected", "retrying…", *countdown(1), *countdown(2), *countdown(4), *countdown(5), "retry in 5 s"]
    assert down == want, seen


def test_a_disconnected_viewer_counts_down_to_each_try(monkeypatch):
    """The status says when the next try is, as each second passes (it once read "retrying in 5 s"
    for the whole wait), and "retrying…" while it tries."""
    counts_down(monkeypatch, refusing_viewer())


def test_a_prompt_the_server_never_got_or_lost_mid_stream_says_so():
    """No server: the error says which prompt was not sent and why, in words (it once read
    "request failed: ConnectError: [Errno 111] Connection refused"); a stream cut off names
    its request and says its state on screen is the server's last report."""
    viewer = refusing_viewer()
    viewer._complete(Submit("ROMEO:\nO", RequestSettings(Sampling(), 8)))
    assert [(e.kind, e.text) for e in viewer._log] == [
        (
            "error",
            '"ROMEO:\\nO" not sent: the server at '
            "http://tinyllm.test is not reachable (Connection refused); "
            "retrying the connection, send it again once the status "
            "says ATTACHED",
        )
    ]

    class CutOff(httpx.SyncByteStream):
        def __iter__(self):
            yield b'data: {"choices": [{"text": "O"}]}\n\n'
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    viewer = AttachRunner(
        "http://tinyllm.test",
        client=httpx.Client(
            transport=httpx.MockTransport(
                lambda request: httpx.Response(200, headers={"x-tinyllm-request-id": "3"}, stream=CutOff())
            )
        ),
    )
    viewer._complete(Submit("ROMEO:", RequestSettings(Sampling(), 8)))
    assert [e.text for e in viewer._log] == [
        "#3: the connection to http://tinyllm.test was lost mid-stream (peer "
        "closed connection without sending complete message body); its state "
        "is the server's last report"
    ]


async def test_a_server_stopping_mid_stream_shows_our_request_ended_not_running():
    """Ctrl+C on the server while our request streams: the viewer's last state is the server's
    last word, which ends the request (it once stayed "running", run 1, beside an event saying
    the server was shutting down)."""
    s = slow_server()
    app = long_app(s.url)
    async with app.run_test(size=(120, 40)) as pilot:
        await submit(pilot, "HAMLET:\n")
        await until(
            pilot,
            lambda: (
                len(app.runner.ours()) == 1
                and app.runner.frame.snapshot.requests
                and app.runner.frame.snapshot.requests[0].state == "running"
            ),
            what="ours running",
        )
        rid = next(iter(app.runner.ours()))
        s.stop()
        await follow(
            pilot,
            lambda: (
                app.runner.frame.status.startswith("disconnected")
                and any(e.text == f"#{rid}: the server is shutting down" for e in app.runner.frame.log)
            ),
            "the disconnect",
        )
        snap = app.runner.frame.snapshot
        assert snap.request(rid).state == "aborted" and snap.num_requests_running == 0
        assert any(e.text.startswith(f"#{rid} aborted after") for e in app.runner.frame.log)
        assert not [e.text for e in app.runner.frame.log if e.kind == "error"]
