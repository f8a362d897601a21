"""The command palette (Ctrl+P) holds the app's actions, each with its keys (issue 44, item 4):
searching `race` found nothing, though the README said it was there.

Uses test_app's helpers and its no-error guard (every app a test makes is watched)."""

from __future__ import annotations

import pytest
from textual.command import CommandList, CommandPalette

from tests.test_app import make_app, no_unexpected_errors, until  # noqa: F401
from tests.test_app_replay import replay_app
from tui.screens.commands import AppCommands
from tui.screens.race import RaceScreen

# what a user searches for → the keys its command shows
SEARCHES = {
    "load": "f3 · o",
    "race": "r",
    "settings": "f2 · s",
    "pause": "f5 · space",
    "step": "f6 · n · .",
    "timeline": "t",
    "record": "--record FILE",
    "abort": "f9 · ^x · x · del",
    "help": "f1 · ?",
}


def results(app) -> list[str]:
    found = app.screen.query_one(CommandList)
    return [str(found.get_option_at_index(i).prompt) for i in range(found.option_count)]


async def search(pilot, words: str) -> list[str]:
    """Ctrl+P, type ``words``, and the palette's results once they are in."""
    app = pilot.app
    await pilot.press("ctrl+p")
    await until(pilot, lambda: isinstance(app.screen, CommandPalette), what="the palette")
    await pilot.press(*words)
    await until(pilot, lambda: any(words.split()[0].lower() in r.lower() for r in results(app)), what=words)
    return results(app)


@pytest.mark.parametrize("words", list(SEARCHES))
async def test_the_palette_finds_each_action_with_its_keys(words):
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        found = await search(pilot, words)
        assert any(f"({SEARCHES[words]})" in r for r in found), found
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, CommandPalette), what="the palette to close")


async def test_a_command_chosen_in_the_palette_runs():
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        paused = app.runner.paused
        found = await search(pilot, "pause")
        assert found[0].startswith("Pause / resume")
        await pilot.press("enter")
        await until(pilot, lambda: app.runner.paused != paused, what="pause to toggle")
        await search(pilot, "race")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RaceScreen), what="the race")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, RaceScreen), what="back from the race")
        await search(pilot, "record")
        await pilot.press("enter")
        await until(pilot, lambda: any("--record FILE" in m for _, _, m in app.notified), what="how to record")


async def test_a_replay_offers_its_own_actions_and_not_what_it_cannot_do():
    app = replay_app()
    async with app.run_test(size=(120, 36)) as pilot:
        found = await search(pilot, "replay")
        assert any("go to a step  (g)" in r for r in found), found
        offered = [title for title, _, _ in AppCommands(app.screen_stack[0])._commands()]
        assert "Replay: go to a step" in offered and "Help: every key, and how to read the screen" in offered
        for off in (
            "Abort the selected request",
            "Type a prompt",
            "Race: static vs continuous batching on the same requests",
        ):
            assert off not in offered
