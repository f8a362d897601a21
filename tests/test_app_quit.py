"""Quitting never loses work silently (issue 44, item 2): q / Ctrl+C / Ctrl+Q with requests to
run or a recording open ask once (the key again, or y, quits; Esc stays); Ctrl+C quits the same
way in every mode; a recording cut short before anything was recorded is removed, so the name is
free for --record again.

Uses test_app's helpers and its no-error guard (every app a test makes is watched)."""

from __future__ import annotations

import argparse
from contextlib import asynccontextmanager

import pytest
import torch

from tests.test_app import (
    LoadingRunner,
    bundled,
    make_app,
    no_unexpected_errors,  # noqa: F401
    step,
    submit,
    until,
    watched_app,
)
from tests.test_race_app import race_app, small_work
from tinyllm.engine import ContinuousEngine, Sampling
from tinyllm.request import RequestSettings
from tui.app import TinyLLMApp
from tui.cli import check_writable
from tui.runners.frames import FrameRecorder
from tui.screens.modals import QuitConfirm
from tui.screens.race import RaceScreen


def asked(app) -> bool:
    return isinstance(app.screen, QuitConfirm)


@asynccontextmanager
async def one_request(new: int):
    """The app (120x36) with one request sent, "ROMEO:" for ``new`` tokens: its pilot."""
    app = make_app(new=new)
    async with app.run_test(size=(120, 36)) as pilot:
        await submit(pilot, "ROMEO:")
        yield pilot


@pytest.mark.parametrize("key", ["q", "ctrl+c", "ctrl+q"])
async def test_quit_with_requests_running_asks_once_and_the_key_again_quits(key):
    async with one_request(new=100) as pilot:
        app = pilot.app
        await pilot.press("escape")  # to the list, where q is a key
        await pilot.press(key)
        assert asked(app) and app.is_running
        assert "1 request is queued or running: it stops when the app quits" in str(
            app.screen.query_one("#confirm-message").render()
        )
        await pilot.press("escape")  # stay
        assert not asked(app) and app.is_running
        await pilot.press(key)
        assert asked(app)
        await pilot.press(key)
        assert app.return_code == 0
    assert app.runner._stop.is_set()


async def test_ctrl_c_in_the_editor_asks_and_y_quits_and_q_there_is_text():
    async with one_request(new=100) as pilot:
        app = pilot.app
        await pilot.press("q")
        assert app.query_one("#prompt").text == "q" and not asked(app)  # in the editor q is text
        await pilot.press("ctrl+c")
        assert asked(app)
        await pilot.press("y")
        assert app.return_code == 0


async def test_nothing_to_lose_quits_at_once():
    async with one_request(new=4) as pilot:
        await step(pilot, 10)  # done: nothing running
        await pilot.press("ctrl+c")
        assert pilot.app.return_code == 0


async def test_ctrl_c_quits_the_same_way_over_the_race():
    """The race over the main app: Ctrl+C is the app's quit (asking, requests are queued)."""
    async with one_request(new=100) as pilot:
        app = pilot.app
        await pilot.press("escape", "r")
        await until(pilot, lambda: isinstance(app.screen, RaceScreen), what="the race")
        await pilot.press("ctrl+c")
        assert asked(app)
        await pilot.press("ctrl+c")
        assert app.return_code == 0


@pytest.mark.parametrize("over_help", [False, True], ids=["race", "its-help"])
async def test_ctrl_c_quits_the_race_on_its_own(over_help):
    """tinyllm-tui --race: Ctrl+C said 'Press q to quit the app' (Textual's default); it quits."""
    app = race_app(small_work(2))
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, RaceScreen), what="the race")
        if over_help:
            await pilot.press("f1")
            await until(pilot, lambda: not isinstance(app.screen, RaceScreen), what="the race's help")
        await pilot.press("ctrl+c")
        assert app.return_code == 0
    assert not any("Press" in str(n.message) for n in app._notifications)


async def test_a_recording_cut_short_during_loading_is_not_offered_for_replay(tmp_path):
    """Ctrl+C while the engine loads, with --record: asked once (a recording is open); the engine
    never started, so no file, and the note says nothing was recorded."""
    from tinyllm.config import EngineConfig
    from tinyllm.model.checkpoint import default_model_dir
    from tui.runners.engine_spec import EngineSpec

    path = tmp_path / "run.jsonl"
    runner = LoadingRunner(
        EngineSpec(str(default_model_dir()), EngineConfig(max_num_seqs=4, max_len=128, kv="paged", block_size=8))
    )
    app = TinyLLMApp(runner, bundled()[1], model_name="test", settings=RequestSettings(Sampling(), 12), recording=path)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("ctrl+c")
        assert asked(app) and "--record" in str(app.screen.query_one("#confirm-message").render())
        await pilot.press("ctrl+c")
        assert app.return_code == 0
    note = app.recording_note()
    assert "nothing was recorded" in note and "--replay" not in note and not path.exists()


def _recording_app(path, new: int = 4) -> TinyLLMApp:
    model, tok = bundled()
    eng = ContinuousEngine(model, 2, 128, kv="paged", block_size=8, generator=torch.Generator().manual_seed(0))
    rec = FrameRecorder(path, eng.snapshot(), "shakespeare", "nowhere", {})  # writes its header now
    return watched_app(eng, tok, new, recorder=rec, recording=path)


async def test_a_recording_with_nothing_in_it_is_removed_and_its_name_is_free_again(tmp_path):
    path = tmp_path / "run.jsonl"
    app = _recording_app(path)
    async with app.run_test(size=(120, 36)) as pilot:
        assert path.exists()
        await pilot.press("ctrl+c", "y")
        assert app.return_code == 0
    note = app.recording_note()
    assert f"removed {path}" in note and not path.exists()

    def refuse(message):
        raise AssertionError(message)

    check_writable(argparse.Namespace(error=refuse), str(path))  # --record takes the name again


async def test_a_recording_of_a_run_is_kept_and_the_note_says_how_to_replay_it(tmp_path):
    path = tmp_path / "run.jsonl"
    app = _recording_app(path)
    async with app.run_test(size=(120, 36)) as pilot:
        await submit(pilot, "ROMEO:")
        await step(pilot, 6)
        await pilot.press("ctrl+c", "y")
    note = app.recording_note()
    assert f"recorded {app.runner.frame.snapshot.counters.steps} steps to {path.resolve()}" in note
    assert f"--replay {path}" in note and path.exists()
