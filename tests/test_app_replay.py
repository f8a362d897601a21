"""The app over a recording: --record in a live app, --replay of it, the timeline panel.

Uses test_app's helpers and its no-error guard (imported: every app a test makes is watched)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import chunked_engine
from tests.test_app import (  # noqa: F401
    BOUND,
    EFFECTS,
    Before,
    _watch,
    bundled,
    no_unexpected_errors,
    step,
    submit,
    until,
    watched_app,
)
from tinyllm.observe.recording import read_recording
from tui.app import TinyLLMApp
from tui.cli import build_app
from tui.runners.frames import FrameRecorder
from tui.runners.interface import SeekStep, SetDelay, SetPaused
from tui.runners.replay import ReplayRunner
from tui.screens.modals import GotoStep, HelpScreen
from tui.widgets.timeline import TimelinePanel

RECORDING = Path(__file__).parent / "data" / "preemption-run.jsonl"  # scripts/make_test_recording.py


def replay_app(path: Path = RECORDING, paused: bool = True) -> TinyLLMApp:
    app = TinyLLMApp(ReplayRunner(path, paused=paused), None, model_name="shakespeare")
    _watch(app)
    return app


async def goto(pilot, n: int) -> None:
    app = pilot.app
    await pilot.press("g")
    await until(pilot, lambda: isinstance(app.screen, GotoStep))
    await pilot.press(*str(n), "enter")  # the current step is selected: typing replaces it
    await until(pilot, lambda: app.runner.frame.snapshot.counters.steps == n, what=f"step {n}")


async def test_a_run_recorded_in_the_app_replays_frame_for_frame(tmp_path):
    """Record a live app (paused, explicit steps, an abort), then replay the file: at each
    step the replay's frame holds what the live app showed."""
    path = tmp_path / "run.jsonl"
    model, tok = bundled()
    eng = chunked_engine(model, 2, 128, block_size=8, budget=8, seeded=True, kv_blocks=7)
    rec = FrameRecorder(path, eng.snapshot(), "shakespeare", "nowhere", {})
    live = watched_app(eng, tok, 30, recorder=rec)
    seen = {}
    async with live.run_test(size=(120, 40)) as pilot:
        for text in ("ROMEO:\nO, she doth teach", "JULIET:\n", "HAMLET:\nTo be"):
            await submit(pilot, text)
        for _ in range(25):
            await step(pilot)
            seen[live.runner.frame.snapshot.counters.steps] = live.runner.frame
        live.select(1)
        live.query_one("#requests").focus()
        await pilot.press("x")  # abort #1 mid-run
        await until(pilot, lambda: live.runner.frame.snapshot.request(1).state == "aborted")
        seen[live.runner.frame.snapshot.counters.steps] = live.runner.frame  # a step shows its last state
        await step(pilot, 60)
        seen[live.runner.frame.snapshot.counters.steps] = live.runner.frame
        await pilot.press("q")
        if live.is_running:  # requests still running: it asked
            await pilot.press("y")
    assert live.runner.returned.wait(5)
    assert any(r.preemptions for r in live.runner.frame.snapshot.requests), "the small pool should preempt"

    app = replay_app(path)
    async with app.run_test(size=(120, 40)) as pilot:
        for s in sorted(seen)[::6] + [max(seen)]:
            await goto(pilot, s)
            got, want = app.runner.frame, seen[s]
            assert got.snapshot == want.snapshot, f"step {s}"
            assert (got.texts, got.prompts, got.log, got.tracks) == (want.texts, want.prompts, want.log, want.tracks)
            assert (got.tokens_per_s, got.tps_history) == (want.tokens_per_s, want.tps_history), f"step {s}"
        status = app.query_one("#status").text.plain
        assert "REPLAY" in status and f"step {max(seen)} of {max(seen)}" in status
        assert "paged KV · fcfs · chunked ≤8 tok/step" in status  # the recorded engine's settings, as live


async def test_replay_keys_move_through_the_recording():
    app = replay_app()
    r = app.runner
    pre = next(rid for rid, evs in r._events.items() if any(k == "preempted" for _, k in evs))
    async with app.run_test(size=(120, 40)) as pilot:
        await goto(pilot, 20)
        await pilot.press("n")
        await until(pilot, lambda: r.step == 21)
        await pilot.press("b", "comma")
        await until(pilot, lambda: r.step == 19)
        app.select(pre)
        moments = [s for s, _ in r.events_of(pre)]
        await goto(pilot, 0)
        for want in sorted(set(moments)):
            await pilot.press("right_square_bracket")
            await until(pilot, lambda: r.step == want, what=f"] to step {want}")
        await pilot.press("left_square_bracket")
        await until(pilot, lambda: r.step == sorted(set(moments))[-2])
        await pilot.press("space")  # play at 5 ms/step: reaches the end
        r.send(SetDelay(5))
        # (the frame's pause: the runner pauses at the end, then publishes the frame that says so)
        await until(pilot, lambda: r.at_end and r.frame.paused, timeout=30, what="the replay to play to its end")
        assert app.query_one("#scrubber").text.plain.startswith(" ⏸ step")


@pytest.mark.parametrize("paused", [True, False], ids=["paused", "playing"])
async def test_every_binding_in_a_replay_acts_or_is_off(paused):
    """Each key in a replay: replay keys move it, view keys act, keys that would change the run
    are off (hidden from the footer) and do nothing. (One test per phase: the two run on two
    test workers at once.)"""
    app = replay_app()
    r = app.runner
    async with app.run_test(size=(80, 24)) as pilot:
        for key, action in BOUND:
            if EFFECTS[action] is None:
                continue
            app.set_layout(False)  # each key from the list view (p switches to the panes view)
            if action in TinyLLMApp.READ_ONLY or action == "leave_input":
                assert action == "leave_input" or app.check_action(action, ()) is False
                r.send(SetPaused(True))
                await until(pilot, lambda: r.paused)
                before, focused = r.frame.snapshot, app.focused
                await pilot.press(key)
                await pilot.pause(0.05)
                assert r.frame.snapshot == before, f"{key!r} changed a replay"
                assert len(app.screen_stack) == 1 and app.focused is focused, f"{key!r} acted in a replay"
                continue
            for cmd in (SetPaused(True), SetDelay(200), SeekStep(40)):
                r.send(cmd)  # the runner thread applies them in order
            await until(  # the frame at step 40 too: Before and the selection read it
                pilot,
                lambda: (
                    r.paused
                    and r.step == 40
                    and r.step_delay_ms == 200
                    and (r.frame.paused, r.frame.snapshot.counters.steps, r.frame.step_delay_ms) == (True, 40, 200)
                ),
            )
            app.select(next(v.rid for v in r.frame.snapshot.requests if r.events_of(v.rid)))
            app.query_one("#requests").focus()
            if not paused:
                r.send(SetPaused(False))
                await until(pilot, lambda: not r.paused)
            was = Before(app)
            if action == "step_once" and not paused:
                was.notes = len(app.notified)
            await pilot.press(key)
            await until(
                pilot,
                lambda: _replay_effect(app, action, was, paused),
                what=f"{key!r} ({action}) in a replay, {'paused' if paused else 'playing'}",
            )
            if len(app.screen_stack) > 1:
                await pilot.press("escape")
                await until(pilot, lambda: len(app.screen_stack) == 1)


def _replay_effect(app, action, was, paused) -> bool:
    steps = app.runner.frame.snapshot.counters.steps
    if action == "step_once":
        return steps > was.step if paused else any("works while paused" in m for _, _, m in app.notified[was.notes :])
    if action in ("step_back", "prev_event"):
        return steps < was.step or (not paused and steps != was.step)
    if action == "next_event":
        return steps > was.step or any("has no" in m for _, _, m in app.notified[was.notes :])
    if action == "goto_step":
        return isinstance(app.screen, GotoStep)
    if action == "help":
        return isinstance(app.screen, HelpScreen)
    return EFFECTS[action](app, was)


async def test_going_back_shows_the_panels_as_they_were():
    """Back in time, the event log and the request pane show that step, not what came later;
    a recorded error is history, not a new error notification."""
    app = replay_app()
    r = app.runner
    async with app.run_test(size=(120, 40)) as pilot:
        await goto(pilot, r.last_step)
        log = app.query_one("#log")
        await until(pilot, lambda: any("finished" in e.text for e in log.lines))
        app.select(5)  # aborted at step 30
        await goto(pilot, 10)
        await until(pilot, lambda: list(log.lines) == list(r.frame.log))
        assert all(e.step <= 10 for e in log.lines) and not any("finished" in e.text for e in log.lines)
        pane = app.query_one("#pane")
        await until(pilot, lambda: "aborted" not in pane.query_one("#pane-header").text.plain)
        await goto(pilot, 0)
        await pilot.press("b")  # before the first step: stays
        await pilot.pause(0.1)
        assert r.step == 0


async def test_timeline_panel_draws_each_request_life():
    app = replay_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await goto(pilot, app.runner.last_step)
        await pilot.press("t")
        tl = app.query_one("#timeline", TimelinePanel)
        await until(pilot, lambda: tl.display and tl.tracks)
        for _ in range(2):
            await pilot.press("z")  # 4 steps per column: the whole run fits
        await pilot.pause(0.1)
        text = tl.render().plain
        rows = {line.split()[0]: line for line in text.splitlines()[1:] if line.strip().startswith("#")}
        assert set(rows) == {f"#{v.rid}" for v in app.runner.frame.snapshot.requests}
        assert "4 steps/col" in text.splitlines()[0]
        preempted = [v.rid for v in app.runner.frame.snapshot.requests if v.preemptions]
        assert preempted and all("P" in rows[f"#{rid}"] for rid in preempted)
        assert "✗" in rows["#5"]  # aborted at step 30
        assert all("✓" in rows[f"#{v.rid}"] for v in app.runner.frame.snapshot.requests if v.state == "finished")
        assert any("◆" in line for line in rows.values()), "a prefix-cache hit should be marked"
        await pilot.press("t")
        await until(pilot, lambda: app.query_one("#requests").display and not tl.display)


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_the_timeline_key_names_the_cells_on_screen_whole(size):
    """The key to every glyph (~110 columns) sat on one line and was cut off at 120 columns
    (`░queued s:no slot k:KV full b:`): it names the glyphs the chart shows now, each whole,
    wrapped onto the lines the width needs (F1 lists them all)."""
    from tui.widgets.timeline import LEGEND

    app = replay_app()
    async with app.run_test(size=size) as pilot:
        await goto(pilot, 70)
        await pilot.press("t")
        tl = app.query_one("#timeline", TimelinePanel)
        await until(pilot, lambda: tl.display and tl.tracks)
        await pilot.pause(0.1)
        lines = tl.render().plain.splitlines()
        first_row = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#"))
        key, rows = " ".join(lines[:first_row]), lines[first_row:]
        chart = "".join(line.split(" ", 1)[1] if " " in line.lstrip() else "" for line in (r.lstrip() for r in rows))
        assert key.startswith("steps ") and first_row <= 3
        named = [glyph + name in key for (glyph, _, _), name in LEGEND]
        for ((glyph, _, _), name), said in zip(LEGEND, named):
            assert not said or glyph in chart, (glyph, name, key)  # only what is on screen, each whole
        cut = key.endswith(" …")  # (a short panel: the rest in F1)
        glyphs = [glyph for (glyph, _, _), _ in LEGEND]  # ░ is two cells (queued, between chunks) in
        missing = [
            i
            for i, g in enumerate(glyphs)  # two colours: plain text cannot tell them
            if glyphs.count(g) == 1 and g in chart and not named[i]
        ]
        assert (not missing) if not cut else (missing and min(missing) > max(i for i, s in enumerate(named) if s)), (
            key,
            missing,
        )
        assert cut == (size == (80, 24)) and "s:no slot" not in key  # nothing in this run waited for a slot
        assert "P:preempted" in key or cut
        assert all(len(line) <= tl.size.width for line in lines[:first_row])


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_timeline_snapshot(snap_compare, size):
    app = replay_app()

    async def run_before(pilot):
        await goto(pilot, 70)
        await pilot.press("t")
        await pilot.press("z")
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--replay", "nope.jsonl"], "--replay: nope.jsonl: cannot read it"),
        (["--replay", str(RECORDING), "--record", "x.jsonl"], "cannot be used together"),
        (["--replay", str(RECORDING), "--attach", "127.0.0.1:9"], "--replay and --attach cannot be used together"),
        (["--attach", "htp://127.0.0.1:9"], "--attach htp://127.0.0.1:9: a server's address is http://HOST:PORT"),
        (["--attach", "127.0.0.1:abc"], "--attach 127.0.0.1:abc: Invalid port: 'abc': a server's address is http://"),
        (["--attach", "foo:bar:baz"], "--attach foo:bar:baz: Invalid port: 'bar:baz': a server's address is"),
        (["--attach", "http://[::1"], "--attach http://[::1: Invalid port"),
        (["--attach", "127.0.0.1:99999"], "--attach 127.0.0.1:99999: port 99999 is not in 1-65535: a server's"),
        (["--attach", "http://:80"], "--attach http://:80: no host: a server's address is"),
        (["--record", "/no/such/dir/run.jsonl"], "the directory /no/such/dir does not exist"),
        (["--record", "/"], "is a directory"),
    ],
)
def test_record_and_replay_arguments_are_checked(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        build_app(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_newer_recording_is_refused_with_its_version(tmp_path, capsys):
    p = tmp_path / "new.jsonl"
    p.write_text('{"format": "tinyllm-recording", "version": 7, "engine": {}}\n')
    with pytest.raises(SystemExit):
        build_app(["--replay", str(p)])
    assert "format version 7, newer than this tinyllm reads (up to 1)" in capsys.readouterr().err


def test_the_committed_recording_still_reads():
    """Format stability: a version-1 file made by scripts/make_test_recording.py replays."""
    header, records, warning = read_recording(RECORDING)
    assert header["version"] == 1 and warning is None and records
    r = ReplayRunner(RECORDING)
    assert r.last_step == records[-1][1]["step"] and r.event_steps(("preempted",))


async def test_replay_goes_to_its_start_and_end_and_its_help_lists_only_what_works():
    """< and > jump to the recording's first and last step (Home / End move in the request
    list); the help lists the replay's keys and none of those a replay turns off."""
    app = replay_app()
    async with app.run_test(size=(120, 40)) as pilot:
        last = app.runner.last_step
        await pilot.press("greater_than_sign")
        await until(pilot, lambda: app.runner.frame.snapshot.counters.steps == last, what="the last step")
        await pilot.press("less_than_sign")
        await until(pilot, lambda: app.runner.frame.snapshot.counters.steps == 0, what="step 0")
        await pilot.press("f1")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        rows = dict(app.screen.rows())
        assert rows["<"] == "Replay: go to the start" and rows[">"] == "Replay: go to the end"
        assert rows["g"] == "Replay: go to a step"
        offered = set(rows.values())
        for off in (
            "Abort",
            "Abort all",
            "Settings",
            "Load prompts",
            "Type a prompt",
            "Clear the prefix cache",
            "Race: static vs continuous batching",
            "submit the prompt in the input",
            "Leave the input",
        ):
            assert off not in offered, off


def test_tokens_per_s_follows_a_burst_after_idle_time():
    """A replay's (and an attached server's) tokens/s is the last second of engine time, frame by
    frame. The first frame after an idle one starts it afresh, so a new burst's rate is not spread
    over the idle time before it (it read 0 for a second while requests ran); slow steps, frames
    more than a second apart, keep their rate; a restarted server's clock starts it afresh too."""
    from types import SimpleNamespace

    from tui.runners.rate import TokenRate

    rate = TokenRate()

    def frame(t: float, n: int, running: int = 1) -> float:
        return rate.update(
            SimpleNamespace(
                time_s=t,
                counters=SimpleNamespace(generated_tokens=n),
                num_requests_running=running,
                num_requests_waiting=0,
            )
        )

    for i in range(41):  # 2 s at 200 tokens/s, a frame every 50 ms
        tps = frame(i * 0.05, i * 10)
    assert tps == pytest.approx(200)
    frame(2.05, 410, running=0)  # the run ends: idle
    assert frame(5.0, 410) == 0  # 3 s later a burst: no span yet
    assert frame(5.05, 420) == pytest.approx(200)  # not 10 tokens over 3 idle seconds
    assert frame(5.10, 430) == pytest.approx(200)
    for k in range(1, 4):  # slow steps: 30 tokens every 1.5 s
        tps = frame(5.10 + 1.5 * k, 430 + 30 * k)
    assert tps == pytest.approx(20)
    assert frame(0.05, 10) == 0 and frame(0.10, 30) == pytest.approx(400)  # a restarted server's clock


def test_the_scrubbers_marks_stay_put_wherever_the_replay_is():
    """The marks (P: preemptions, x: aborts) sit at the same cells at every step: the bar's
    width followed the step number's digits (step 0 against step 165), so they moved."""
    from types import SimpleNamespace

    from tui.widgets.status import scrubber

    runner = SimpleNamespace(
        last_step=734, event_steps=lambda kinds: {"preempted": [9, 170, 171, 400, 733], "aborted": [52]}[kinds[0]]
    )

    def bar(now: int) -> str:
        f = SimpleNamespace(paused=True, step_delay_ms=0, snapshot=SimpleNamespace(counters=SimpleNamespace(steps=now)))
        line = scrubber(f, runner, 120, None).plain
        assert len(line) == 120
        return line

    lines = [bar(now) for now in (0, 7, 165, 734)]
    here = {line.index("●") for line in lines}  # (the cursor covers a mark)
    marks = [frozenset(i for i, c in enumerate(line) if c in "Px") - here for line in lines]
    assert len(marks[0]) >= 2 and len(set(marks)) == 1


async def test_a_replayed_speculation_run_shows_its_drafts_in_the_pane_and_counters(tmp_path):
    """A recording of a speculating engine, replayed at 120x36: at a step that verified a draft,
    the selected request's pane marks the draft's tokens kept and rolled back, and the counters
    say the drafts kept so far, as the recorded snapshot holds them, and the timeline marks the step
    (its tracks rebuilt from the recording); after going back too."""
    from tests.test_recording import record_run

    path = tmp_path / "spec.jsonl"
    record_run(path, "chunked-speculation", aborts=())
    app = replay_app(path)
    async with app.run_test(size=(120, 36)) as pilot:
        steps = []  # (step, a request whose draft it verified): the first two such steps
        for _ in range(200):
            snap = app.runner.frame.snapshot
            drafted = [v for v in snap.requests if v.last_draft and v.last_draft_step == snap.counters.steps]
            if drafted:
                steps.append((snap.counters.steps, drafted[0].rid))
            if len(steps) == 2:
                break
            n = snap.counters.steps
            await pilot.press("n")
            await until(pilot, lambda: app.runner.frame.snapshot.counters.steps > n, what=f"step {n + 1}")
        assert len(steps) == 2, "the recorded run should verify drafts in two steps"
        for s, rid in reversed(steps):  # the later step first, then back to the earlier
            await goto(pilot, s)
            app.select(rid)
            v = app.runner.frame.snapshot.request(rid)
            marks = "✓" * v.last_kept + "✗" * (v.last_draft - v.last_kept)
            await until(pilot, lambda: marks in app.query_one("#pane-body").render().plain, what="the draft's marks")
            assert (
                f"a draft of {v.last_draft}: {marks} {v.last_kept} kept" in app.query_one("#pane-body").render().plain
            )
            c = app.runner.frame.snapshot.counters
            shown = " ".join(app.query_one("#kv").render().plain.split())
            assert f"drafts kept {c.spec_accepted_tokens / c.spec_draft_tokens:.0%}" in shown, shown
            track = next(t for t in app.runner.frame.tracks if t.rid == rid)  # the timeline's row marks it
            assert s in track.draft_steps and all(d <= s for d in track.draft_steps)
        await pilot.press("t")  # the timeline: the drafted step's cell, and its key
        panel = app.query_one(TimelinePanel)
        await until(pilot, lambda: panel.display and "»" in panel.render().plain, what="the timeline's draft mark")
        assert "»drafted" in panel.render().plain.replace(" ", "")


def test_a_replay_names_the_model_as_the_live_app_did(tmp_path):
    """The live app says "bundled Shakespeare"; its replay said "shakespeare" (the directory's name
    in the recording's header). The shipped checkpoint is known by its name and tokenizer."""
    import json

    from tinyllm.model.config import default_model_dir, model_label
    from tui.remote_cli import recorded_model

    assert model_label(None) == model_label(default_model_dir()) == "bundled Shakespeare"
    assert model_label(tmp_path / "mine") == "mine"
    header = json.loads(RECORDING.read_text().splitlines()[0])
    assert build_app(["--replay", str(RECORDING)]).model_name == "bundled Shakespeare"
    assert recorded_model({**header, "tokenizer": "sha256:another"}) == "shakespeare"  # same name, not ours
    assert recorded_model({**header, "model": "llama"}) == "llama"
