"""The dialogs do what they say, tested with a user's typing (issue 44, item 3): F3's path field
takes typed text and Enter loads what was typed (a bad path is a clear error, nothing loaded;
the dialog's list is one key away); the settings and go-to-step fields take keys in the order
they came, at machine speed too.

Uses test_app's helpers and its no-error guard (every app a test makes is watched)."""

from __future__ import annotations

import json

from tests.test_app import make_app, no_unexpected_errors, until  # noqa: F401
from tests.test_app_prompt import burst
from tinyllm.workload import bundled_workloads
from tui.screens.picker import PromptPicker
from tui.screens.settings import SettingsScreen


def loaded(app) -> list[str]:
    return [e.text for e in app.runner.frame.log if e.text.startswith("loaded ")]


def error(app) -> str:
    return str(app.screen.query_one("#picker-error").render())


async def open_picker(pilot) -> None:
    await pilot.press("f3")
    await until(pilot, lambda: isinstance(pilot.app.screen, PromptPicker), what="the load dialog")


async def test_f3_typing_goes_to_the_path_field_and_enter_loads_what_was_typed(tmp_path):
    """Typing bad.jsonl + Enter loaded batch_and_chat.jsonl (the list had the focus) and started it."""
    good = tmp_path / "two.jsonl"
    good.write_text("".join(json.dumps({"prompt": p, "max_new_tokens": 4}) + "\n" for p in ("ROMEO:", "JULIET:")))
    app = make_app(max_len=512)
    async with app.run_test(size=(120, 36)) as pilot:
        await open_picker(pilot)
        await pilot.press(*"bad.jsonl", "enter")
        assert isinstance(app.screen, PromptPicker) and app.screen.query_one("#picker-path").value == "bad.jsonl"
        assert "bad.jsonl: no such file" in error(app) and "nothing was loaded" in error(app)
        assert "relative path starts in" in error(app)
        assert not loaded(app) and not app.runner.frame.snapshot.requests
        await pilot.press("ctrl+u", *str(good), "enter")  # Ctrl+U: the field's start, as in a shell
        await until(pilot, lambda: not isinstance(app.screen, PromptPicker), what="the dialog to close")
        await until(pilot, lambda: len(app.runner.frame.snapshot.requests) == 2, what="two.jsonl's requests")
        assert loaded(app)[-1].startswith("loaded two.jsonl")
        assert [app.runner.frame.prompts[v.rid] for v in app.runner.frame.snapshot.requests] == ["ROMEO:", "JULIET:"]


async def test_f3_a_bundled_name_typed_or_picked_from_the_list_loads_it():
    app = make_app(max_len=512)
    async with app.run_test(size=(120, 36)) as pilot:
        await open_picker(pilot)
        await pilot.press(*"shared_prefix", "enter")  # a bundled workload's name
        await until(pilot, lambda: loaded(app), what="shared_prefix")
        assert loaded(app)[-1].startswith("loaded shared_prefix.jsonl")
        await open_picker(pilot)
        await pilot.press("down", "down", "enter")  # ↓: to the list, ↓: its second
        await until(pilot, lambda: len(loaded(app)) == 2, what="the second bundled workload")
        second = list(bundled_workloads())[1]
        assert loaded(app)[-1].startswith(f"loaded {second}.jsonl")


async def test_f3_a_letter_typed_on_the_list_goes_to_the_path_field():
    app = make_app(max_len=512)
    async with app.run_test(size=(120, 36)) as pilot:
        await open_picker(pilot)
        await pilot.press("down", *"nope", "enter")
        assert app.screen.query_one("#picker-path").value == "nope" and "nope: no such file" in error(app)
        assert not loaded(app)
        await pilot.press("enter")  # an empty field says what to do
        await pilot.press("ctrl+u", "enter")
        assert "type a path to a .jsonl file first" in error(app)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, PromptPicker), what="escape")
    assert not loaded(app)


async def test_f3_a_path_typed_at_machine_speed_is_the_path_loaded():
    """bad + 3 backspaces + nope + Enter in one burst: the field's backspaces and Enter ran
    after the letters that followed them (Textual's Input runs them as bindings, late)."""
    app = make_app(max_len=512)
    async with app.run_test(size=(120, 36)) as pilot:
        await open_picker(pilot)
        burst(app, "bad" + "\x7f" * 3 + "nope.jsonl\r")
        await until(pilot, lambda: "no such file" in error(app), what="the error")
        assert app.screen.query_one("#picker-path").value == "nope.jsonl"
        assert "nope.jsonl: no such file" in error(app)


async def test_the_settings_fields_take_keys_typed_at_machine_speed_in_order():
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen), what="the settings")
        field = app.screen.query_one("#temperature")
        burst(app, "\x7f" * len(field.value) + "0.25" + "\t" + "\x7f" * 5 + "7\r")
        await until(pilot, lambda: not isinstance(app.screen, SettingsScreen), what="the settings applied")
        assert app.settings.sampling.temperature == 0.25 and app.settings.sampling.top_k == 7


async def test_served_on_the_web_f3_reads_only_its_folders_and_never_says_what_exists(tmp_path, monkeypatch):
    """--web: any visitor can type a path; F3 read any file on the machine and its errors said
    whether one existed. Outside the allowed folders both answers are the same, and nothing loads."""
    from tui.screens.picker import PICKER_ROOTS_ENV

    inside = tmp_path / "ok"
    inside.mkdir()
    (inside / "one.jsonl").write_text(json.dumps({"prompt": "ROMEO:", "max_new_tokens": 4}) + "\n")
    monkeypatch.setenv(PICKER_ROOTS_ENV, str(inside))
    monkeypatch.chdir(tmp_path)  # short relative paths: each character is a key press
    app = make_app(max_len=512)
    async with app.run_test(size=(120, 36)) as pilot:
        answers = []
        for path in ("/etc/passwd", "/no/such.jsonl", "ok/../ok/../x.jsonl"):
            await open_picker(pilot)
            await pilot.press(*path, "enter")
            answers.append(error(app).replace(path, "PATH"))
            assert "outside the folders this app reads files from" in answers[-1]
            await pilot.press("escape")
        assert len(set(answers)) == 1 and not loaded(app)
        await open_picker(pilot)
        await pilot.press(*"ok/one.jsonl", "enter")
        await until(pilot, lambda: loaded(app), what="the file inside")
        await open_picker(pilot)
        await pilot.press(*"burst", "enter")  # a bundled workload's name: always allowed
        await until(pilot, lambda: len(loaded(app)) == 2, what="the bundled workload")


async def test_the_newest_request_is_in_view_when_the_list_first_scrolls(tmp_path):
    """Loading a 3-request file twice left #4 and #5 below the list's edge: the cursor moved to
    the newest in the frame that made the list scrollable, before its scroll range grew."""
    from tui.widgets.request_list import RequestList

    five = tmp_path / "five.jsonl"
    five.write_text("".join(json.dumps({"prompt": p, "max_new_tokens": 4}) + "\n" for p in "ABCDE"))
    app = make_app(max_len=512)
    async with app.run_test(size=(100, 20)) as pilot:
        rows = app.query_one(RequestList)
        for n in (5, 10, 15):  # loaded again and again: the list becomes scrollable on the way
            await open_picker(pilot)
            app.screen.query_one("#picker-path").value = str(five)
            await pilot.press("enter")
            await until(pilot, lambda: len(app.runner.frame.snapshot.requests) == n, what=f"{n} requests")
            await pilot.pause()
            visible = rows.scrollable_content_region.height - 1  # (its header row)
            top = int(rows.scroll_offset.y)
            assert rows.selected_rid() == app.runner.frame.snapshot.requests[-1].rid
            assert top <= rows.cursor < top + visible, (n, top, rows.cursor, visible)
        assert len(app.runner.frame.snapshot.requests) > visible  # it did become scrollable
        assert not [n for n in app._notifications if n.severity == "error"]


async def test_the_request_lists_scrollbar_is_a_bar_apart_from_the_rows(tmp_path):
    """Its thumb read like stray text at a row's end: one column in colours of its own, apart
    from every row's."""
    from tui.widgets.request_list import RequestList

    app = make_app(max_len=512)
    async with app.run_test(size=(100, 20)) as pilot:
        rows = app.query_one(RequestList)
        await pilot.pause()
        st = rows.styles
        assert st.scrollbar_size_vertical == 1
        assert st.scrollbar_background != st.background and st.scrollbar_color != st.color
