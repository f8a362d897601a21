"""The prompt editor (issue 44, item 1): what the user types is what is sent.

Keys are real key presses (``pilot.press``) or, for machine speed, a terminal's own bytes parsed
by Textual's parser and handed to the app all at once (keys, bracketed pastes), as a fast typist,
a terminal replaying its input, or tmux's send-keys deliver them. Every test waits for the event
it needs; a timeout is only a backstop.

Uses test_app's helpers and its no-error guard (every app a test makes is watched)."""

from __future__ import annotations

from textual import events
from textual._xterm_parser import XTermParser
from textual.widgets import Footer

from tests.test_app import (  # noqa: F401
    LoadingRunner,
    _watch,
    bundled,
    errors_of,
    make_app,
    no_unexpected_errors,
    step,
    until,
    watched_app,
)
from tinyllm.engine import ContinuousEngine, Sampling
from tinyllm.observe.recording import read_recording
from tinyllm.request import RequestSettings
from tui.app import TinyLLMApp
from tui.runners.frames import FrameRecorder
from tui.runners.interface import Submit
from tui.widgets.prompt_editor import PromptEditor
from tui.widgets.request_list import RequestList
from tui.widgets.timeline import TimelinePanel

PASTE = "\x1b[200~{}\x1b[201~"  # a bracketed paste, as a terminal sends it


def burst(app, raw: str) -> None:
    """Hand the app ``raw`` as a terminal sends it, all at once: every key and paste is queued
    before the app has handled the first."""
    parser = XTermParser()
    for event in [*parser.feed(raw), *parser.feed("")]:
        event.set_sender(app)
        app._driver.send_message(event)


# (what the terminal sends, the prompts that must reach the engine)
TYPED = "".join(
    (
        "ROMEO:\rJULIET:\rHAMLET: To be\r",  # three prompts with Enter, at machine speed
        "hello" + "\x7f" * 5 + "ROMEO:\r",  # typed, rubbed out, typed again
        PASTE.format("HAMLET:\nTo be, or not to be"),
        "\r",  # a two-line paste, sent
        PASTE.format("KING:\r\nWho's there?"),
        "\r",  # a paste with CR LF line ends
        "NURSE:\nHonest\r",  # Ctrl+J (a line feed): a new line
        "queen of the ",
        PASTE.format("fairies"),
        " she is\r",  # a paste in the middle of typing
    )
)
SENT = [
    "ROMEO:",
    "JULIET:",
    "HAMLET: To be",
    "ROMEO:",
    "HAMLET:\nTo be, or not to be",
    "KING:\nWho's there?",
    "NURSE:\nHonest",
    "queen of the fairies she is",
]


def editor(app) -> PromptEditor:
    return app.query_one("#prompt", PromptEditor)


def footer_keys(app) -> str:
    footer = app.screen.query_one(Footer)
    return " ".join(f"{k.key_display} {k.description}" for k in footer.query("FooterKey"))


async def test_a_newcomer_who_types_a_prompt_first_thing_gets_a_prompt():
    """Letters that are keys on the list (o opens a dialog, space pauses, q quits, s settings,
    x aborts, t the timeline) are text in the editor, where the app starts; the footer says the
    keys go to the editor (Send, New line, esc for the keys) and, after Esc, to the list."""
    app = make_app()
    typed = "queen ROMEO: o s x t n ?"
    async with app.run_test(size=(120, 36)) as pilot:
        assert app.focused is editor(app)
        paused, steps = app.runner.paused, app.runner.steps_done
        await pilot.press(*typed)
        assert editor(app).text == typed and app.is_running and len(app.screen_stack) == 1
        assert (app.runner.paused, app.runner.steps_done) == (paused, steps)
        assert not app.query_one(TimelinePanel).display
        assert footer_keys(app).startswith("⏎ Send ^j New line") and "esc Leave the prompt" in footer_keys(app)
        await pilot.press("enter")
        await until(pilot, lambda: len(app.runner.frame.snapshot.requests) == 1, what="the request")
        assert list(app.runner.frame.prompts.values()) == [typed] and editor(app).text == ""
        await pilot.press("escape")
        assert isinstance(app.focused, RequestList)
        # (the footer recomposes after the focus moves: wait for it)
        await until(
            pilot, lambda: "Send" not in footer_keys(app) and "i Type a prompt" in footer_keys(app), what="the footer"
        )
        await pilot.press("i")
        assert app.focused is editor(app) and editor(app).text == ""  # i went to the editor, typed nothing
        await pilot.press("escape", "enter")  # Enter on the list: the editor too
        assert app.focused is editor(app)
        await pilot.press("f1")  # the help says so
        rows = dict(app.screen.rows())
        assert rows["i / slash / enter"] == "Type a prompt" and rows["esc"] == "Leave the prompt"
        assert rows["ctrl+j (in the prompt)"].startswith("a new line")
        await pilot.press("escape")
    assert not errors_of(app)


async def test_keys_and_pastes_at_machine_speed_during_loading_send_exactly_what_was_typed():
    """Three prompts typed with Enter at machine speed during LOADING went as three copies of
    all three run together; hello, 5 backspaces, ROMEO:, Enter sent 'helloR'; a two-line paste
    kept its first line. Each prompt is now the editor's text at its Enter."""
    from tinyllm.config import EngineConfig
    from tinyllm.model.checkpoint import default_model_dir
    from tui.runners.engine_spec import EngineSpec

    runner = LoadingRunner(
        EngineSpec(str(default_model_dir()), EngineConfig(max_num_seqs=4, max_len=128, kv="paged", block_size=8))
    )
    app = TinyLLMApp(runner, bundled()[1], model_name="test", settings=RequestSettings(Sampling(), 12))
    async with app.run_test(size=(120, 36)) as pilot:
        assert "LOADING" in app.query_one("#status").text.plain
        burst(app, TYPED)

        def sent():
            return [c.prompt for c in runner.sent if isinstance(c, Submit)]

        await until(pilot, lambda: len(sent()) >= len(SENT), what="every prompt to be sent")
        await pilot.pause()
        assert sent() == SENT and editor(app).text == ""
        assert not [n for n in app._notifications if n.severity == "error"]


async def test_prompts_typed_at_machine_speed_reach_the_engine_and_the_recording_as_typed(tmp_path):
    model, tok = bundled()
    eng = ContinuousEngine(model, 3, 128, kv="paged", block_size=8, kv_blocks=64)
    path = tmp_path / "typed.jsonl"
    rec = FrameRecorder(path, eng.snapshot(), "shakespeare", "nowhere", {})
    app = watched_app(eng, tok, 4, recorder=rec)
    async with app.run_test(size=(120, 36)) as pilot:
        burst(app, TYPED)
        await until(pilot, lambda: len(app.runner.frame.snapshot.requests) >= len(SENT), what="every request")
        frame = app.runner.frame
        assert [frame.prompts[v.rid] for v in frame.snapshot.requests] == SENT
        assert [v.prompt for v in frame.snapshot.requests] == [tuple(tok.encode(t)) for t in SENT]
        await step(pilot, 20)
    _, records, _ = read_recording(path)
    recorded = {int(rid): text for _, r in records for rid, text in r.get("prompt", {}).items()}
    assert [recorded[rid] for rid in sorted(recorded)] == SENT


async def test_multi_line_prompts_newline_keys_and_pastes_keep_every_line():
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        box = editor(app)
        await pilot.press(*"ROMEO:", "ctrl+j", *"But soft")
        assert box.text == "ROMEO:\nBut soft"
        for key in ("shift+enter", "alt+enter", "ctrl+enter"):  # where the terminal reports them
            await pilot.press(key)
        assert box.text == "ROMEO:\nBut soft\n\n\n"
        await pilot.press("backspace", "backspace", "backspace")
        app.post_message(events.Paste("\nwhat light\r\nthrough yonder"))
        await until(pilot, lambda: "yonder" in box.text, what="the paste")
        assert box.text == "ROMEO:\nBut soft\nwhat light\nthrough yonder"
        assert box.region.height == 4  # it grows with its lines
        await pilot.press("enter")
        await until(pilot, lambda: app.runner.frame.prompts, what="the request")
        assert list(app.runner.frame.prompts.values()) == ["ROMEO:\nBut soft\nwhat light\nthrough yonder"]
        assert box.region.height == 1


async def test_up_in_an_empty_editor_brings_back_earlier_prompts_as_a_shell_does():
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        box = editor(app)
        for text in ("ROMEO:", "JULIET:"):
            await pilot.press(*text, "enter")
        await until(pilot, lambda: len(app.runner.frame.prompts) == 2, what="two requests")
        assert box.text == ""
        await pilot.press("up")
        assert box.text == "JULIET:"
        await pilot.press("up")
        assert box.text == "ROMEO:"
        await pilot.press("up")  # the oldest: stays
        assert box.text == "ROMEO:"
        await pilot.press("down", "down")
        assert box.text == ""  # past the newest: empty again
        await pilot.press("up", "up", "enter")  # sent again, as recalled
        await until(pilot, lambda: len(app.runner.frame.prompts) == 3, what="the recalled prompt")
        assert list(app.runner.frame.prompts.values())[-1] == "ROMEO:"
        await pilot.press("up")
        assert box.text == "ROMEO:"  # (sent twice, kept once)
        await pilot.press("backspace", "up")  # edited: ↑ moves the cursor
        assert box.text == "ROMEO"


async def test_multi_line_history_walks_by_line_then_by_prompt():
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        box = editor(app)
        await pilot.press(*"JULIET:", "ctrl+j", *"O Romeo", "enter")
        await until(pilot, lambda: len(app.runner.frame.prompts) == 1, what="the request")
        assert list(app.runner.frame.prompts.values()) == ["JULIET:\nO Romeo"]
        await pilot.press("up")
        assert box.text == "JULIET:\nO Romeo" and box.cursor_location == (1, 7)
        await pilot.press("up")  # on its last line: to the first
        assert box.cursor_location[0] == 0 and box.text == "JULIET:\nO Romeo"
        await pilot.press("down", "down")  # back down, then past the newest
        assert box.text == ""


async def test_focus_moves_at_once_so_a_burst_of_keys_goes_where_it_was_typed():
    """Esc then t (toggle the timeline) then i and text, all queued at once: Esc's move of the
    focus takes effect before t is handed on (Widget.focus() moved it only after the keys already
    queued, so they went to the editor)."""
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        box = editor(app)
        for key, char in (("escape", "\x1b"), ("t", "t"), ("i", "i"), ("h", "h"), ("i", "i")):
            event = events.Key(key, char)
            event.set_sender(app)
            app._driver.send_message(event)
        await until(pilot, lambda: box.text == "hi", what="the text after i")
        assert app.query_one(TimelinePanel).display and app.focused is box
