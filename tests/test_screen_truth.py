"""The screen is the engine's truth: after any change (a step, a seek, a reconnect, a resize) and
once the engine is idle, every panel shows the snapshot it was drawn from (tests/screen_check.py).

One test per way it went wrong before: rows left stale by the redraw throttle when the engine
went idle, a replay scrubbed backwards that kept the future's rows, a small terminal that hid
rows and blocks, a focus lost between the list and the timeline. The attach cases (a server
restart, aborting other clients' requests) are in test_attach.py."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import chunked_engine
from tests.screen_check import check_panels
from tests.test_app import (
    _watch,
    bundled,
    has_work,
    no_unexpected_errors,  # noqa: F401
    slow_steps,
    step,
    submit,
    submit_and_step,
    until,
    watched_app,
)
from tests.test_app_replay import replay_app
from tinyllm import units
from tinyllm.engine import ContinuousEngine, Sampling
from tinyllm.request import RequestSettings
from tui.app import TinyLLMApp
from tui.runners.engine import EngineRunner
from tui.runners.frames import FrameRecorder
from tui.runners.interface import SeekStep, SetPaused, StepBack, StepOnce, Submit
from tui.screens.settings import SettingsScreen
from tui.widgets.kv_panel import KVPanel
from tui.widgets.request_list import RequestList
from tui.widgets.style import duration
from tui.widgets.timeline import TimelinePanel


async def ticks_until(pilot, cond, timeout: float = 20.0, what: str = "the app") -> None:
    """Wait for ``cond`` while only the app's own tick draws (``until`` forces a draw at the end)."""
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await pilot.pause(0.02)


async def run_to_the_drawn_end(pilot, prompt: str, what: str) -> int:
    """Submit ``prompt`` and wait, on the app's own tick, until its end is the frame on screen."""
    app = pilot.app
    rid = await submit(pilot, prompt)
    await ticks_until(
        pilot,
        lambda: app.runner.frame.snapshot.request(rid).state == "finished" and app._details_frame is app.runner.frame,
        what=what,
    )
    return rid


def paged_app(
    slots: int = 8, kv_blocks: int = 256, new: int = 40, paused: bool = True, stop_at_eos: bool = True
) -> TinyLLMApp:
    model, tok = bundled()
    eng = chunked_engine(model, slots, 512, block_size=16, budget=256, seeded=True, kv_blocks=kv_blocks)
    settings = RequestSettings(Sampling(temperature=0.0), new, stop_at_eos)
    return watched_app(eng, tok, settings=settings, paused=paused)


async def test_the_last_frame_is_drawn_whole_when_the_engine_goes_idle():
    """An idle engine sends no later frame: the app's own tick draws the last one of a run,
    every panel, and the screen is the run's final state."""
    app = paged_app(paused=False)
    async with app.run_test(size=(120, 40)) as pilot:
        rid = await run_to_the_drawn_end(pilot, "café ПРИВЕТ 日本語 🎭 — «naïve»:", "the app's tick to draw the end")
        assert "finished" in app.query_one(RequestList).row_text(rid)
        check_panels(app)


async def test_every_panel_shows_the_same_step_while_the_engine_runs_flat_out():
    """No step delay, every frame the pacer allows: each draw is one frame in every panel. (The
    request list and pane once refreshed at <= 5 Hz while the grid and counters kept up, so a
    fast run showed a request 10-25 steps behind its slot.) Checked at each newly drawn frame
    while the run lasts, however many a machine's speed allows: 2 s at least (400 steps of 5 ms
    or more, no end of text), so a fast machine's run is not over before the first draw."""
    app = paged_app(slots=4, new=200, paused=True, stop_at_eos=False)
    slow_steps(app.runner.engine, 0.005)
    async with app.run_test(size=(120, 40)) as pilot:
        for text in ("ROMEO:", "JULIET:\nO Romeo", "HAMLET:", "KING:", "NURSE:", "LEAR:"):
            await submit(pilot, text)
        app.runner.send(SetPaused(False))
        checked, seen = 0, app.frames_drawn
        while has_work(app.runner.frame) and checked < 30:
            await ticks_until(
                pilot,
                lambda: app.frames_drawn > seen or not has_work(app.runner.frame),
                what="the app's tick to draw a frame",
            )
            if app.frames_drawn > seen:
                seen = app.frames_drawn
                check_panels(app)
                checked += 1
        assert checked >= 1


@pytest.fixture(scope="module")
def staggered_recording(tmp_path_factory) -> Path:
    """A recording whose requests arrive at steps 0, 4, 8, ... (the committed one's all arrive
    at step 0), with a small pool so some are preempted; made by a runner driven by commands."""
    path = tmp_path_factory.mktemp("rec") / "staggered.jsonl"
    model, tok = bundled()
    eng = chunked_engine(model, 2, 128, block_size=8, budget=16, seeded=True, kv_blocks=9)
    runner = EngineRunner(eng, tok, paused=True, recorder=FrameRecorder(path, eng.snapshot(), "shakespeare", "-", {}))
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()

    def wait(cond) -> None:
        end = time.monotonic() + 30
        while not cond():
            assert time.monotonic() < end, "the runner did not get there"
            time.sleep(0.005)

    for i, text in enumerate(("ROMEO:", "JULIET:\nO Romeo", "HAMLET:\nTo be", "KING:", "NURSE:")):
        runner.send(Submit(text, RequestSettings(Sampling(temperature=0.0), 14)))
        wait(lambda: len(runner.frame.snapshot.requests) == i + 1)
        for _ in range(4):
            done = runner.steps_done
            runner.send(StepOnce())
            wait(lambda: runner.frame.steps_done > done)  # (its frame: read below)
    while any(v.state in ("queued", "running", "preempted") for v in runner.frame.snapshot.requests):
        done = runner.steps_done
        runner.send(StepOnce())
        wait(lambda: runner.frame.steps_done > done)
    runner.stop()
    thread.join(10)
    return path


async def test_a_replay_scrubbed_backwards_shows_the_past_only(staggered_recording):
    app = replay_app(staggered_recording)
    async with app.run_test(size=(120, 40)) as pilot:
        last = app.runner.last_step
        app.runner.send(SeekStep(last))
        await until(pilot, lambda: app.runner.frame.snapshot.counters.steps == last, what="the end")
        at_end = len(check_panels(app).snapshot.requests)
        app.select(app.runner.frame.snapshot.requests[-1].rid)
        app.runner.send(SeekStep(5))
        await until(pilot, lambda: app.runner.frame.snapshot.counters.steps == 5, what="step 5")
        frame = check_panels(app)
        assert len(app.query_one(RequestList).rids) == len(frame.snapshot.requests) < at_end
        assert "does not exist yet at step 5" in app.query_one("#pane-header").text.plain


async def test_every_frame_of_a_replay_back_and_forth(staggered_recording):
    """Step forward through the whole recording, then back to the start: each frame checked."""
    app = replay_app(staggered_recording)
    async with app.run_test(size=(120, 40)) as pilot:
        app.action_toggle_timeline()  # the timeline is checked too when shown
        seen = 0
        for cmd, done in ((StepOnce(), lambda s: s >= app.runner.last_step), (StepBack(), lambda s: s <= 1)):
            while not done(app.runner.frame.snapshot.counters.steps):
                before = app.runner.frame.seq
                app.runner.send(cmd)
                await until(pilot, lambda: app.runner.frame.seq != before, what="the next frame")
                check_panels(app)
                seen += 1
            app.action_toggle_timeline()
        assert seen >= 2 * (app.runner.last_step - 2)


async def test_80x24_shows_rows_blocks_timeline_and_the_step():
    """At 80x24 the list shows rows, the timeline shows rows, the block map every block (a
    cell then stands for several), the status line the step counter; also after shrinking."""
    app = paged_app(new=60)
    async with app.run_test(size=(160, 48)) as pilot:
        for text in ("ROMEO:", "JULIET:\nO Romeo", "HAMLET:\nTo be, or not to be", "KING:"):
            await submit(pilot, text)
        await step(pilot, 12)
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: app.size.width == 80, what="the resize")
        await pilot.pause(0.1)
        frame = check_panels(app)
        assert app.query_one("#blocks").size.height >= 2
        rows = app.query_one(RequestList)
        assert rows.size.height - 1 >= len(frame.snapshot.requests), "the list has no room for its rows"
        assert app.query_one(RequestList).region.bottom <= app.query_one("#left").region.bottom
        await pilot.press("escape", "t")
        timeline = app.query_one(TimelinePanel)
        await until(pilot, lambda: timeline.display)
        lines = timeline.render().plain.split("\n")
        assert sum(line.lstrip().startswith("#") for line in lines) == len(frame.snapshot.requests)
        await step(pilot, 3)
        check_panels(app)
        assert app.query_one("#status").text.plain.startswith(" ⏸ PAUSED  step ")


async def test_focus_survives_the_timeline_toggle():
    """Esc, then t twice: the arrows still move the selection (they did not, until i / Esc)."""
    app = paged_app()
    async with app.run_test(size=(120, 40)) as pilot:
        for text in ("ROMEO:", "JULIET:", "HAMLET:"):
            await submit(pilot, text)
        await pilot.press("escape", "home")
        assert app.selected == 0
        await pilot.press("t")
        assert app.focused is app.query_one(TimelinePanel)
        await pilot.press("down")
        await until(pilot, lambda: app.selected == 1, what="down in the timeline")
        await pilot.press("t")
        assert app.focused is app.query_one(RequestList)
        await pilot.press("down")
        await until(pilot, lambda: app.selected == 2, what="down in the list")
        check_panels(app)


async def test_typing_starts_in_the_prompt_and_the_letter_keys_are_one_key_away():
    """Focus starts in the prompt editor (issue 44: typing `hello` first thing opened a dialog at
    o), where letters are text; Esc goes to the list, where t toggles the timeline at once; i
    goes back to the prompt."""
    app = paged_app()
    async with app.run_test(size=(120, 40)) as pilot:
        assert app.focused is app.query_one("#prompt")
        await pilot.press("t", "q")
        assert app.query_one("#prompt").value == "tq" and app.is_running
        await pilot.press("escape", "t")
        assert app.query_one(TimelinePanel).display and app.focused is app.query_one(TimelinePanel)
        await pilot.press("t")
        assert app.focused is app.query_one(RequestList)
        await pilot.press("i", "t", "q")
        assert app.query_one("#prompt").value == "tqtq" and app.is_running
        await pilot.press("escape")
        assert app.focused is app.query_one(RequestList)


async def test_status_line_keeps_the_step_at_any_width():
    app = paged_app()
    async with app.run_test(size=(60, 24)) as pilot:
        await submit(pilot, "ROMEO:")
        await step(pilot, 2)
        status = app.query_one("#status").text.plain
        assert "step 2" in status and len(status) <= 60


# -- rough edges a newcomer hit ---------------------------------------------------------------------
async def test_settings_errors_speak_the_dialogs_words():
    """top_k 0 said 'must be an integer >= 1 or None (off)'; the field says 'blank = off'."""
    app = paged_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        for field, value, want in (
            ("top_k", "0", "top_k must be a whole number >= 1, or blank for off, got '0'"),
            ("top_k", "2.5", "top_k must be a whole number >= 1"),
            ("temperature", "-1", "temperature must be a number >= 0 (0 = greedy)"),
            ("max_new", "0", "max_new_tokens must be a whole number from 1 to"),
        ):
            app.screen.query_one(f"#{field}").value = value
            app.screen.query_one(f"#{field}").focus()
            await pilot.press("enter")  # Enter in a field applies
            await pilot.pause()
            error = str(app.screen.query_one("#settings-error").render())
            assert want in error and "None" not in error, error
            app.screen.query_one(f"#{field}").value = {"top_k": "", "temperature": "0", "max_new": "40"}[field]
        await pilot.press("escape")


async def test_toasts_leave_the_next_request_settings_in_view():
    """Toasts sit at the bottom right; the next request's settings are at the left of the prompt."""
    app = paged_app()
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        app.notify("a toast " * 6, timeout=5)
        await until(pilot, lambda: len(app.screen.query("Toast")) == 1, what="the toast")
        settings = app.query_one("#next-settings").region
        assert settings.x == 0 and settings.width > 10
        assert settings.right <= app.query_one("#prompt").region.x
        toast = app.screen.query_one("Toast").region
        assert toast.x >= settings.right, (toast, settings)


def test_one_duration_format():
    assert [duration(x) for x in (None, 0.0674, 1.234, 12.34, 125, 4000)] == [
        "—",
        "67ms",
        "1.23s",
        "12.3s",
        "2m05s",
        "1h06m",
    ]
    assert all(len(duration(x)) <= 6 for x in (0.9994, 9.996, 59.96, 3599, 359999))
    # the unit is chosen after rounding: never "1000ms" or "60.0s"; no figure can raise
    assert [duration(x) for x in (0.9994, 0.9996, 9.996, 59.96)] == ["999ms", "1.00s", "10.0s", "1m00s"]
    assert [duration(x) for x in (float("nan"), float("inf"), -0.005)] == ["—", "—", "-5ms"]
    assert duration is units.duration  # the bench, the race and what-if write the same


def test_the_bench_race_and_whatif_use_the_one_duration_format():
    from tinyllm.bench import report
    from tinyllm.race import whatif_view
    from tui.widgets import lane_panel, race_track

    for module in (report, whatif_view, lane_panel, race_track):
        assert module.duration is units.duration, module.__name__


async def test_list_pane_and_counters_say_durations_alike():
    app = paged_app()
    async with app.run_test(size=(160, 48)) as pilot:
        v = await submit_and_step(pilot, "ROMEO:", 3)
        ttft = duration(v.ttft_s)
        assert ttft in app.query_one(RequestList).row_text(v.rid)
        assert f"TTFT {ttft}" in app.query_one("#pane-header").text.plain
        assert f"TTFT p50/p95 {ttft}/{ttft}" in app.query_one(KVPanel).render().plain


def test_the_engine_clock_stands_still_while_held():
    """A paused app holds the engine clock: time the user looked does not count in TTFT."""
    model, _ = bundled()
    eng = ContinuousEngine(model, 1, 64)
    eng.hold_clock(True)
    t = eng.now()
    time.sleep(0.05)
    assert eng.now() == t
    eng.hold_clock(False)
    time.sleep(0.01)
    assert eng.now() > t


async def test_ttft_of_a_request_sent_while_paused_counts_no_paused_time():
    app = paged_app()
    async with app.run_test(size=(120, 40)) as pilot:
        rid = await submit(pilot, "ROMEO:")
        t0 = time.monotonic()
        await pilot.pause(0.5)  # the user looks, paused
        await step(pilot, 2)
        paused_for = time.monotonic() - t0
        v = app.runner.frame.snapshot.request(rid)
        assert v.ttft_s is not None and v.ttft_s < paused_for - 0.4, (v.ttft_s, paused_for)
        assert app.runner.engine.now() <= v.first_token_s + (time.monotonic() - t0)  # held again after the step


async def test_record_shows_in_the_status_line_and_says_where_the_file_went(tmp_path, capsys, monkeypatch):
    from tui import cli, cli_checks

    path = tmp_path / "run.jsonl"
    made = {}

    def run(self, *a, **kw):  # instead of a terminal: Pilot, then exit
        made["app"] = self

    monkeypatch.setattr(TinyLLMApp, "run", run)
    monkeypatch.setattr(cli_checks, "not_a_terminal", lambda: None)  # (pytest's stdin is none)
    assert cli.main(["--record", str(path), "--engine-thread", "--paused"]) == 0
    out = capsys.readouterr().out
    # (run() is Pilot's, below: main() saw an app that quit before its engine's first step, so
    # nothing was recorded and the file, header only, is gone; tests/test_app_quit.py: a run's)
    assert f"nothing was recorded (the app quit before the engine's first step); removed {path}" in out
    assert not path.exists()
    app = made["app"]
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        assert f"● REC {path.name}" in app.query_one("#status").text.plain
        await pilot.press("q", "y")  # (a recording open: asked once)


@pytest.mark.parametrize("kv_dtype, bytes_per_token", [("auto", 6144), ("bfloat16", 3072)])
async def test_an_engine_process_sized_by_kv_memory_retitles_the_slots_and_blocks_once_loaded(
    kv_dtype, bytes_per_token
):
    """The app's first frame is the loading one, sized from --slots (8); the engine process sizes
    its cache from --kv-memory only once the model is read (12 sequences, 256 blocks here, twice
    as many at bfloat16). The panels' titles must follow the snapshot (they once kept the loading
    frame's "Slots (8, ...)"), and the KV panel says which dtype the cache holds."""
    from tinyllm.config import EngineConfig
    from tinyllm.model.checkpoint import default_model_dir
    from tui.runners.child import ChildRunner
    from tui.runners.engine_spec import EngineSpec

    model, tok = bundled()
    config = EngineConfig(
        device="cpu", max_len=512, kv="paged", threads=1, kv_memory_mib=24.0, max_num_seqs=12, kv_cache_dtype=kv_dtype
    )
    spec = EngineSpec(str(default_model_dir()), config)
    runner = ChildRunner(spec, paused=True).start(wait=False)
    app = TinyLLMApp(runner, tok, model_name="test", settings=RequestSettings(Sampling(), 4))
    _watch(app)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.runner.ready, timeout=120, what="the engine process to load")
        await until(pilot, lambda: app.runner.frame.snapshot.n_slots == 12)
        snap = check_panels(app).snapshot
        assert (snap.n_slots, snap.kv.n_blocks) == (12, 24 * 2**20 // (16 * bytes_per_token))
        assert snap.kv.dtype == {"auto": "float32"}.get(kv_dtype, kv_dtype)
        assert (
            app.query_one(KVPanel)
            .render()
            .plain.split("\n", 1)[0]
            .endswith("· " + {"auto": "fp32", "bfloat16": "bf16"}[kv_dtype])
        )
        assert app.query_one("#slots").border_title == "Slots (12, up to 512 tokens each)"


async def test_the_status_line_says_idle_when_nothing_runs_or_waits():
    """The finished app said `▶ RUNNING` with nothing to run: unpaused, it says `● IDLE` when
    no request runs, waits or is due to arrive, and `▶ RUNNING` while one does."""
    from dataclasses import replace

    from tui.widgets.status import status_fields

    app = paged_app(new=6)
    async with app.run_test(size=(120, 40)) as pilot:

        def state() -> str:
            return status_fields(replace(app.runner.frame, paused=False), app.runner, "m", None)[0][0]

        assert state() == " ● IDLE "  # nothing submitted yet
        await submit(pilot, "ROMEO:")
        await step(pilot, 1)
        assert app.runner.frame.snapshot.num_requests_running == 1 and state() == " ▶ RUNNING "
        await step(pilot, 20)  # to its end (6 new tokens)
        assert app.runner.frame.snapshot.counters.finished == 1 and state() == " ● IDLE "
        assert app.query_one("#status").text.plain.startswith(" ⏸ PAUSED ")  # paused says so first
        from tui.widgets.request_pane import header_text

        v, now = app.runner.frame.snapshot.request(0), app.runner.frame.snapshot.time_s
        full = header_text(v, now).plain
        assert "TTFT " in full and "slot" in full
        for width in range(len(full) - 1, 19, -1):  # narrower: whole fields go, none is cut
            line = header_text(v, now, width).plain
            assert len(line) <= width and line.startswith("#0 finished") and "6/6 tok" in line
            assert ("TTFT" in line) == bool(re.search(r"TTFT \d+(ms|\.\d+s)", line))


async def test_an_idle_engine_shows_no_rate():
    """Once nothing runs or waits, the counters say tok/s 0: the last frame's rate (the last
    seconds of the run) stayed on screen beside '● IDLE'."""
    app = paged_app(paused=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await run_to_the_drawn_end(pilot, "ROMEO:", "the run's end drawn")
        assert app.runner.frame.tokens_per_s > 0  # the runner's rate over the last seconds
        assert "tok/s 0 " in app.query_one(KVPanel).render().plain + " "
        check_panels(app)
