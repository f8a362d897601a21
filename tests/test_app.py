"""tinyllm-tui, driven by Pilot. Deterministic: the app starts paused and the tests step it."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest
import torch

from tinyllm.engine import ContinuousEngine, Sampling
from tinyllm.model.checkpoint import load_checkpoint
from tinyllm.observe.snapshot import RequestView
from tinyllm.request import RequestSettings
from tinyllm.workload import bundled_workloads
from tui.app import TinyLLMApp
from tui.runners.engine import EngineRunner
from tui.runners.interface import RunnerDefaults, SetDelay, SetPaused, StepOnce, Submit
from tui.screens.modals import GotoStep, HelpScreen
from tui.screens.picker import PromptPicker
from tui.screens.race import RaceScreen
from tui.screens.settings import SettingsScreen
from tui.widgets.block_map import BlockMap
from tui.widgets.kv_panel import KVPanel
from tui.widgets.request_list import RequestList, tail
from tui.widgets.request_pane import RequestPane
from tui.widgets.slot_grid import SlotGrid

_bundled = None


def bundled():
    global _bundled
    if _bundled is None:
        _bundled = load_checkpoint()
    return _bundled


def make_app(
    kv: str = "slots",
    slots: int = 3,
    max_len: int = 128,
    kv_blocks: int | None = None,
    new: int = 12,
    budget: int | None = None,
    **kw,
) -> TinyLLMApp:
    """budget: run the token-budget scheduler (chunked prefill) with that many tokens per step."""
    model, tok = bundled()
    blocks = dict(block_size=8, kv_blocks=kv_blocks) if kv == "paged" else {}  # (a block pool's: paged only)
    eng = ContinuousEngine(
        model,
        slots,
        max_len,
        kv=kv,
        **blocks,
        generator=torch.Generator().manual_seed(0),
        chunked_prefill=budget is not None,
        max_batched_tokens=budget,
    )
    return watched_app(eng, tok, new, **kw)


def watched_app(
    eng: ContinuousEngine,
    tok,
    new: int = 12,
    *,
    settings: RequestSettings | None = None,
    recorder=None,
    paused: bool = True,
    **kw,
) -> TinyLLMApp:
    """The app over ``eng`` in a thread (paused: the test steps it), its requests ``new`` tokens
    long unless ``settings`` say otherwise, watched (``_watch``)."""
    app = TinyLLMApp(
        EngineRunner(eng, tok, paused=paused, recorder=recorder),
        tok,
        model_name="test",
        settings=settings or RequestSettings(Sampling(), new),
        **kw,
    )
    _watch(app)
    return app


def slow_steps(engine: ContinuousEngine, seconds: float) -> None:
    """Make each of ``engine``'s steps take ``seconds`` at least (no step delay: the runner still
    runs flat out): a lower bound on a run's length that does not depend on the machine's speed,
    for a test that acts while the run goes on."""
    real_step = engine.step

    def step():
        time.sleep(seconds)
        return real_step()

    engine.step = step


# -- the no-error guard --------------------------------------------------------------------------
# F5/space once popped "engine · <command> failed" on every press while the test that pressed
# space passed: it never looked. So every app a test makes is watched, and the test fails unless
# it declares the errors it provokes with @pytest.mark.expect_errors("text", ...).
_made: list[TinyLLMApp] = []


def _watch(app: TinyLLMApp) -> None:
    """Record every notification (Textual forgets them when they expire or the app exits) and
    when the engine loop returns (its last frame then holds the whole log)."""
    app.notified = []  # (severity, title, message)
    notify = app.notify

    def recording_notify(message, **kw):
        app.notified.append((kw.get("severity", "information"), kw.get("title", ""), str(message)))
        notify(message, **kw)

    app.notify = recording_notify
    run, app.runner.started, app.runner.returned = app.runner.run, threading.Event(), threading.Event()

    def watched_run(*a, **kw):
        app.runner.started.set()
        try:
            run(*a, **kw)
        finally:
            app.runner.returned.set()

    app.runner.run = watched_run
    _made.append(app)


def errors_of(app: TinyLLMApp) -> list[str]:
    """The runner's 'error' log entries and the app's error notifications (warnings are fine)."""
    return [e.text for e in app.runner.frame.log if e.kind == "error"] + [
        f"{title}: {msg}" for sev, title, msg in app.notified if sev == "error"
    ]


@pytest.fixture(autouse=True)
def no_unexpected_errors(request):
    """After the test, once each app's engine loop has returned: every error must be declared."""
    _made.clear()
    yield
    apps, expected = list(_made), request.node.get_closest_marker("expect_errors")
    _made.clear()
    expected = expected.args if expected else ()
    seen = set()
    for app in apps:
        if app.runner.started.is_set():
            assert app.runner.returned.wait(5), "the engine loop did not stop with the app"
        for err in errors_of(app):
            hits = {text for text in expected if text in err}
            assert hits, f"the app showed an error no test expected: {err!r}"
            seen |= hits
    assert seen == set(expected), f"expected errors that never came: {sorted(set(expected) - seen)}"


async def until(pilot, cond, timeout: float = 20.0, what: str = "the app") -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)
    pilot.app.refresh_from_runner(force=True)
    await pilot.pause()


def has_work(frame) -> bool:
    return frame.pending_arrivals > 0 or any(
        r.state in ("queued", "running", "preempted") for r in frame.snapshot.requests
    )


async def step(pilot, n: int = 1) -> None:
    """Step the paused engine up to n times (fewer if it runs out of work)."""
    app = pilot.app
    for _ in range(n):
        if not has_work(app.runner.frame):
            break
        target = app.runner.steps_done + 1
        app.runner.send(StepOnce())
        # the frame's count, not the runner's: the runner counts a step before it publishes the
        # step's frame, and the caller reads that frame
        await until(pilot, lambda: app.runner.frame.steps_done >= target, what=f"step {target}'s frame")


async def submit(pilot, text: str) -> int:
    """Type ``text`` in the prompt and press Enter; wait until the runner holds the request."""
    app = pilot.app
    before = len(app.runner.frame.snapshot.requests)
    app.query_one("#prompt").focus()
    app.query_one("#prompt").value = text
    await pilot.press("enter")
    await until(pilot, lambda: len(app.runner.frame.snapshot.requests) > before, what="the request to arrive")
    return app.runner.frame.snapshot.requests[-1].rid


async def submit_and_step(pilot, text: str, n: int) -> RequestView:
    """Submit ``text``, step the paused engine up to n times; the request's view then."""
    rid = await submit(pilot, text)
    await step(pilot, n)
    return pilot.app.runner.frame.snapshot.request(rid)


async def test_submit_streams_engine_text_into_pane_and_grid():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        v = await submit_and_step(pilot, "ROMEO:\n", 4)
        rid = v.rid
        assert v.state == "running" and len(v.tokens) == 5  # admit step + 4 decode steps
        grid = app.query_one(SlotGrid)
        assert grid.snapshot.slots[v.slot].rid == rid
        assert f"#{rid}" in grid.render().plain
        pane = app.query_one(RequestPane)
        assert pane.rid == rid
        expected = app.tokenizer.decode(list(v.tokens), skip_special_tokens=True)
        assert pane.body_text == "ROMEO:\n" + app.runner.frame.texts[rid]
        assert expected.startswith(app.runner.frame.texts[rid])  # incremental == full decode
        await step(pilot, 12)
        v = app.runner.frame.snapshot.request(rid)
        assert v.state == "finished"
        assert app.runner.frame.texts[rid] == app.tokenizer.decode(list(v.tokens), skip_special_tokens=True)


async def test_the_pane_keeps_its_header_in_view_over_a_long_text():
    """A text longer than the pane scrolls under its header: the header (which request, its
    state, tokens, TTFT) stays on the pane's first row while the text follows the newest token
    (it scrolled away with the text: the pane showed text without saying whose)."""
    app = make_app(new=160, slots=1, max_len=256)
    async with app.run_test(size=(80, 24)) as pilot:
        rid = await submit(pilot, "ROMEO:\n")
        await step(pilot, 120)
        frame = app.runner.frame
        await until(pilot, lambda: app._shown_seq == frame.seq)
        await pilot.pause()
        pane = app.query_one(RequestPane)
        scroll = pane.query_one("#pane-scroll")
        assert scroll.max_scroll_y > 0 and scroll.scroll_y == scroll.max_scroll_y  # long, and following
        top = pane.content_region
        widget, _ = app.screen.get_widget_at(top.x, top.y)
        assert widget is pane.query_one("#pane-header")
        header = pane.query_one("#pane-header").text.plain
        assert header.startswith(f"#{rid} running") and f"{len(frame.snapshot.request(rid).tokens)}/160 tok" in header


async def test_two_requests_keep_their_own_sampling():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        a = await submit(pilot, "JULIET:\n")
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        app.screen.query_one("#temperature").value = "0.9"
        app.screen.query_one("#top_k").value = "20"
        app.screen.query_one("#max_new").value = "7"
        await pilot.click("#apply")
        await until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        b = await submit(pilot, "HAMLET:\n")
        await step(pilot, 10)
        snap = app.runner.frame.snapshot
        assert snap.request(a).sampling == Sampling() and snap.request(a).max_new_tokens == 12
        assert snap.request(b).sampling == Sampling(0.9, 20) and snap.request(b).max_new_tokens == 7
        assert snap.request(b).state == "finished" and len(snap.request(b).tokens) <= 7


async def test_invalid_setting_is_explained_and_nothing_changes():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        before = app.settings
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        app.screen.query_one("#top_p").value = "1.5"
        await pilot.click("#apply")
        await pilot.pause()
        assert isinstance(app.screen, SettingsScreen)
        assert "top_p must be a number in (0, 1]" in str(app.screen.query_one("#settings-error").render())
        app.screen.query_one("#top_p").value = ""
        app.screen.query_one("#temperature").value = "warm"
        app.screen.query_one("#temperature").focus()
        await pilot.press("enter")  # Enter in a field applies too
        await pilot.pause()
        assert "temperature must be a number" in str(app.screen.query_one("#settings-error").render())
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        assert app.settings == before
        assert app.runner.frame.snapshot.requests == ()


async def test_tab_moves_between_the_settings_fields():
    """Tab / Shift+Tab move from field to field (the app refused every action of its own while a
    dialog was open, and Textual's focus_next with them: whatever was typed went to temperature);
    the app's own keys stay off in the dialog (s types an s)."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        assert app.focused.id == "temperature"
        await pilot.press("tab")
        assert app.focused.id == "top_k"
        await pilot.press("tab", "tab")
        assert app.focused.id == "max_new"
        await pilot.press("shift+tab")
        assert app.focused.id == "top_p"
        await pilot.press("shift+tab", "7", "s")  # s: a letter in a field, not the settings key
        assert app.screen.query_one("#top_k").value == "7s" and app.screen.query_one("#temperature").value == "0"
        await pilot.press("backspace", "enter")
        await until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        assert app.settings.sampling.top_k == 7
        await pilot.press("f2")  # keys in one burst (a paste, a fast typist)
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        from textual import events

        for key, char in (("tab", "\t"), ("tab", "\t"), ("0", "0"), ("full_stop", "."), ("5", "5")):
            app.post_message(events.Key(key, char))  # (pilot.press waits after each key)
        await until(pilot, lambda: app.focused.id == "top_p" and app.focused.value.endswith("0.5"))
        assert app.screen.query_one("#top_k").value == "7"  # the keys after each Tab went past it


async def test_stop_strings_and_seed_from_the_settings_dialog():
    """The dialog's stop list and seed reach the request: its text ends before the stop string
    (matched on the text by tinyllm.stops, the engine told at once: finished, slot free)."""
    app = make_app(new=24)
    async with app.run_test(size=(80, 24)) as pilot:
        a = await submit(pilot, "ROMEO:\n")
        await step(pilot, 30)
        full = app.runner.frame.texts[a]
        cut = len(full) // 2
        stop = full[cut - 1 : cut + 1]
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        assert app.screen.query_one("#apply").region.bottom <= 24  # still fits 80x24
        app.screen.query_one("#stop").value = "never|" + stop.replace("\n", "\\n")
        app.screen.query_one("#seed").value = "5"
        app.screen.query_one("#repetition_penalty").value = "1"
        await pilot.click("#apply")
        await until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        assert app.settings.stop == ("never", stop) and app.settings.sampling.seed == 5
        shown = str(app.query_one("#next-settings").render())  # the next-request line says it
        assert "stop=never|" + stop.replace("\n", "\\n") in shown
        v = await submit_and_step(pilot, "ROMEO:\n", 30)
        assert v.state == "finished" and len(v.tokens) < 24 and v.sampling.seed == 5
        assert app.runner.frame.texts[v.rid] == full[: full.find(stop)]
        assert all(s.free for s in app.runner.frame.snapshot.slots)
        assert any("a stop token or string" in e.text for e in app.runner.frame.log if e.rid == v.rid)


async def test_logprobs_show_the_latest_tokens_alternatives_in_the_pane():
    app = make_app(new=6)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        app.screen.query_one("#logprobs").value = "3"
        await pilot.click("#apply")
        await until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        a = await submit(pilot, "ROMEO:\n")
        b_settings = app.settings
        await step(pilot, 3)
        choices = app.runner.frame.choices[a]
        v = app.runner.frame.snapshot.request(a)
        assert b_settings.logprobs == 3 and len(choices) == 3  # greedy: the top one is chosen
        assert choices[0][0] == app.tokenizer.token_text(v.tokens[-1])
        assert choices[0][1] >= choices[1][1] >= choices[2][1] and sum(p for _, p in choices) <= 1 + 1e-6
        pane = app.query_one(RequestPane)
        pane.show(app.runner.frame, a)
        body = pane.query_one("#pane-body").render().plain
        assert f"latest token: {choices[0][0]!r} {100 * choices[0][1]:.0f}%" in body


@pytest.mark.parametrize("kv", ["slots", "paged"])
async def test_abort_running_frees_slot_and_kv(kv):
    app = make_app(kv=kv, new=40)
    async with app.run_test(size=(120, 40)) as pilot:
        a = await submit(pilot, "ROMEO:\n")
        b = await submit(pilot, "JULIET:\n")
        await step(pilot, 3)
        snap = app.runner.frame.snapshot
        slot_a = snap.request(a).slot
        used_before = snap.kv.used_tokens
        app.select(a)
        app.query_one("#prompt").focus()
        await pilot.press("ctrl+x")  # works from the input
        await until(pilot, lambda: app.runner.frame.snapshot.request(a).state == "aborted")
        snap = app.runner.frame.snapshot
        assert snap.slots[slot_a].free
        assert snap.kv.used_tokens < used_before
        assert snap.kv.used_tokens == snap.slots[snap.request(b).slot].context_len
        assert snap.request(b).state == "running"
        panel_text = "".join(seg.text for seg in app.console.render(app.query_one(KVPanel).render()))
        assert re.search(r"abort(ed)? 1\b", panel_text)


async def test_pause_means_no_steps_and_step_once_is_one_step():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await submit(pilot, "ROMEO:\n")
        await pilot.pause(0.3)
        assert app.runner.frame.snapshot.counters.steps == 0
        app.query_one("#requests").focus()
        await pilot.press("n")
        await until(pilot, lambda: app.runner.frame.steps_done == 1, what="the step's frame")
        await pilot.pause(0.3)  # (and no step after it)
        assert app.runner.frame.snapshot.counters.steps == 1
        await pilot.press("space")  # resume: it runs on its own
        await until(pilot, lambda: app.runner.steps_done >= 5)
        await pilot.press("space")
        await until(pilot, lambda: app.runner.paused)
        n = app.runner.steps_done
        await pilot.pause(0.3)
        assert app.runner.steps_done == n


async def test_step_once_with_only_arrivals_to_come_brings_the_next_one():
    """Paused, nothing queued or running, a workload's next request due in 30 s: a step press
    brings it in and steps (each press logged "nothing to do" while the workload's clock crept
    0.05 s a press: ~600 presses); with nothing left at all, "nothing to do" is said once."""
    from tinyllm.workload import WorkItem
    from tui.runners.interface import LoadWorkload

    app = make_app(new=3)
    async with app.run_test(size=(120, 40)) as pilot:
        items = (WorkItem("ROMEO:\n", arrival_s=0.0), WorkItem("JULIET:\n", arrival_s=30.0))
        tokens = tuple(tuple(app.tokenizer.encode(it.prompt)) for it in items)
        app.runner.send(LoadWorkload("two", items, tokens, app.settings))
        await until(pilot, lambda: len(app.runner.frame.snapshot.requests) == 1)  # the first, due at once
        while app.runner.frame.snapshot.requests[0].state != "finished":  # it runs and finishes
            await step(pilot)
        frame = app.runner.frame
        assert [r.state for r in frame.snapshot.requests] == ["finished"] and frame.pending_arrivals == 1
        done = app.runner.steps_done
        app.runner.send(StepOnce())
        await until(pilot, lambda: app.runner.frame.steps_done == done + 1, what="the step's frame")
        frame = app.runner.frame
        assert frame.pending_arrivals == 0 and len(frame.snapshot.requests) == 2
        assert frame.snapshot.requests[1].state == "running"
        assert any("next arrival was 29." in e.text and e.text.endswith("it arrives now") for e in frame.log)
        await step(pilot, 10)
        for _ in range(3):
            app.runner.send(StepOnce())
        app.runner.send(SetPaused(True))  # logs "paused": after the three, in order
        await until(pilot, lambda: app.runner.frame.log[-1].text == "paused")
        assert sum(e.text.startswith("step: nothing to do") for e in app.runner.frame.log) == 1


async def test_the_log_counts_a_one_token_prompt_in_the_singular():
    """A one-token prompt's log line said "(1 prompt tokens"."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.runner.send(Submit("R", RequestSettings(Sampling(), 4)))  # (one token in the bundled tokenizer)
        await until(pilot, lambda: any("queued (" in e.text for e in app.runner.frame.log), what="the queued line")
        (line,) = [e.text for e in app.runner.frame.log if "queued (" in e.text]
        assert "(1 prompt token, max 4 new" in line, line


async def test_step_delay_keys_change_delay():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.query_one("#requests").focus()
        await pilot.press("plus", "plus")
        await until(pilot, lambda: app.runner.step_delay_ms == 10)
        await pilot.press("minus")
        await until(pilot, lambda: app.runner.step_delay_ms == 5)
        for _ in range(15):
            await pilot.press("f7")
        await until(pilot, lambda: app.runner.step_delay_ms == 1000)


async def test_paged_tight_pool_shows_preemptions():
    app = make_app(kv="paged", slots=4, kv_blocks=12, new=60)
    async with app.run_test(size=(120, 40)) as pilot:
        for who in ("ROMEO", "JULIET", "HAMLET", "LEAR"):
            await submit(pilot, f"{who}:\n")
        for _ in range(80):
            await step(pilot)
            if app.runner.frame.snapshot.counters.preemptions:
                break
        n = app.runner.frame.snapshot.counters.preemptions
        assert n > 0
        panel_text = "".join(seg.text for seg in app.console.render(app.query_one(KVPanel).render()))
        assert re.search(rf"preempt(ed)? {n}\b", panel_text)
        assert any(e.kind == "preempt" for e in app.runner.frame.log)


@pytest.mark.parametrize("path", bundled_workloads().values(), ids=lambda p: p.name)
async def test_each_shipped_prompt_file_loads(path):
    app = make_app(max_len=512, new=100)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f3")
        await until(pilot, lambda: isinstance(app.screen, PromptPicker))
        app.screen._try(path)
        await until(pilot, lambda: not isinstance(app.screen, PromptPicker))
        n = sum(1 for line in path.read_text().splitlines() if line.strip())
        await until(pilot, lambda: len(app.runner.frame.snapshot.requests) + app.runner.frame.pending_arrivals == n)
        assert any(e.text.startswith(f"loaded {path.name}") for e in app.runner.frame.log)


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"prompt": "ROMEO:"}\n{"prompt": "x", "temperature": -1}\n', ":2: temperature must be"),
        ('{"prompt": "ROMEO:"}\nnot json\n', ":2: invalid JSON"),
        ('{"prompt": ""}\n', ":1: 'prompt' is required"),
        ('{"prompt": "a", "top_k": 0}\n', ":1: top_k must be"),
        ('{"prompt": "a", "colour": "red"}\n', ":1: unknown field(s) colour"),
        ('{"prompt": "a", "max_new_tokens": 100000}\n', ":1: prompt is"),
    ],
)
async def test_malformed_prompt_file_is_refused_whole(tmp_path, content, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        a = await submit(pilot, "ROMEO:\n")
        await step(pilot, 2)
        before = app.runner.frame.snapshot
        await pilot.press("f3")
        await until(pilot, lambda: isinstance(app.screen, PromptPicker))
        app.screen.query_one("#picker-path").value = str(bad)
        app.screen.query_one("#picker-path").focus()
        await pilot.press("enter")
        await until(
            pilot,
            lambda: (
                not isinstance(app.screen, PromptPicker)
                or "nothing was loaded" in str(app.screen.query_one("#picker-error").render())
            ),
            what="the picker's answer",
        )
        assert isinstance(app.screen, PromptPicker)  # still open, explaining
        err = str(app.screen.query_one("#picker-error").render())
        assert f"{bad}{message}" in err and "nothing was loaded" in err
        await pilot.press("escape")
        await pilot.pause(0.2)
        after = app.runner.frame.snapshot
        assert [r.rid for r in after.requests] == [r.rid for r in before.requests] == [a]
        assert after.counters.steps == before.counters.steps and after.request(a).state == "running"


@pytest.mark.expect_errors("not sent")
async def test_prompt_too_long_is_not_sent():
    app = make_app(max_len=32)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("i")  # the list has focus at start
        app.query_one("#prompt").value = "word " * 40
        await pilot.press("enter")
        await until(pilot, lambda: app.notified, what="the refusal")
        await pilot.pause(0.2)  # (nothing else comes, nothing is sent)
        assert [(sev, title) for sev, title, _ in app.notified] == [("error", "not sent")]
        assert app.runner.frame.snapshot.requests == ()
        assert app.query_one("#prompt").value == "word " * 40  # nothing lost


async def test_request_list_keys_and_clicks_select_requests():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        rids = [await submit(pilot, f"Line {i}:") for i in range(5)]
        await step(pilot, 2)
        lst = app.query_one(RequestList)
        pane = app.query_one(RequestPane)
        lst.focus()
        await pilot.press("home")
        await until(pilot, lambda: app.selected == rids[0])
        await pilot.press("down", "down")
        await until(pilot, lambda: app.selected == rids[2])
        assert pane.body_text.startswith("Line 2:")
        await pilot.press("up")
        await until(pilot, lambda: app.selected == rids[1])
        await pilot.press("end")
        await until(pilot, lambda: app.selected == rids[4])
        await pilot.press("down")  # past the end: stays
        await until(pilot, lambda: lst.cursor == 4)
        await pilot.click(RequestList, offset=(3, 1 + 1 + 3))  # border, header, then row 3
        await until(pilot, lambda: app.selected == rids[3])
        assert lst.row_text(rids[3]).split()[:2] == [str(rids[3]), "queued"]  # 3 slots: it waits


@pytest.mark.parametrize("width", [160, 100, 60])
async def test_request_list_fits_narrow_terminals(width):
    """Narrow screens drop the sampling/TTFT/rate columns before squeezing the text column."""
    app = make_app()
    async with app.run_test(size=(width, 40)) as pilot:
        rid = await submit(pilot, "ROMEO:\n")
        await step(pilot, 3)
        lst = app.query_one(RequestList)
        lst.show(app.runner.frame)
        row = lst.row_text(rid)
        assert len(row) == lst.scrollable_content_region.width
        n = len(app.runner.frame.snapshot.request(rid).tokens)
        assert "running" in row and f"{n}/12" in row
        assert ("greedy" in row) == (width >= 160)  # sampling column only when wide


def test_tail_counts_cells_not_characters():
    assert tail("short", 10) == "short"
    assert tail("a\nb", 10) == "a⏎ b"
    assert tail("x" * 30, 10) == "…" + "x" * 9
    wide = tail("漢字" * 20, 9)  # 2 cells each
    assert wide.startswith("…") and sum(2 if ord(c) > 0x2E80 else 1 for c in wide) <= 9


async def test_generated_markup_characters_show_literally():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await submit(pilot, "[bold]not bold[/bold] \\[x] [red]")
        await step(pilot, 1)
        pane = app.query_one(RequestPane)
        rendered = pane.query_one("#pane-body").render()
        assert rendered.plain.startswith("[bold]not bold[/bold] \\[x] [red]")


async def test_quit_with_running_requests_exits_and_stops_the_thread():
    """Quit while the engine runs flat out (no step delay) with two requests running. From its
    fourth step the engine waits (inside a step) until the first q has asked, so the requests
    are still running then however fast or slow the machine (on a fast one they could end
    first, and q quit without asking; a busy one took longer than a fixed run's length)."""
    app = make_app(settings=RequestSettings(Sampling(), 100, stop_at_eos=False))
    engine, asked = app.runner.engine, threading.Event()
    real_step = engine.step

    def step():
        if engine.steps >= 3:
            asked.wait(30)
        return real_step()

    engine.step = step
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            for who in ("ROMEO", "JULIET"):
                await submit(pilot, f"{who}:\n")
            app.query_one("#requests").focus()
            await pilot.press("space")  # running flat out
            await until(pilot, lambda: app.runner.steps_done >= 3)
            await pilot.press("q")  # requests running: asked once
            assert app.is_running and type(app.screen).__name__ == "QuitConfirm"
            asked.set()
            await pilot.press("q")
    finally:
        asked.set()
    engine_threads = [t for t in threading.enumerate() if "engine" in t.name.lower()]
    for t in engine_threads:
        t.join(timeout=1.0)
        assert not t.is_alive()
    assert app.runner._stop.is_set()


async def test_help_screen_lists_every_key():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f1")
        await pilot.pause()
        rows = dict(app.screen.rows())
        whats = [what for _, what in app.screen.rows()]
        assert len(whats) == len(set(whats)), whats  # one row per action, with all its keys
        assert len(rows) == len(whats)  # and one per key: p was listed twice, by its binding and its words
        assert rows["p"].startswith("the panes view") and rows["ctrl+p"].startswith("the command palette")
        assert rows["f5 / space"] == "Pause/resume"
        assert rows["q / ctrl+c / ctrl+q"] == "Quit"
        for keys, what in [
            ("f1 / ?", "Help"),
            ("f6 / n / .", "Step once (paused)"),
            ("f7 / + / =", "Slower: +step delay"),
            ("f8 / -", "Faster: -step delay"),
            ("f9 / ctrl+x / x / delete", "Abort selected request"),
            ("ctrl+k / X", "Abort all requests"),
            ("f3 / o", "Load prompts"),
            ("f2 / s", "Settings"),
        ]:
            assert rows[keys] == what
        assert not any(what.startswith("Replay:") for what in rows.values())  # a replay's keys only there
        assert rows["↑ / ↓ · PgUp / PgDn · Home / End"].startswith("select a request")  # the list's own keys
        await pilot.press("escape")


def _loaded_app(size):
    app = make_app(
        kv="paged", slots=4, max_len=256, kv_blocks=40, prompts_file=bundled_workloads()["shakespeare_openings"]
    )

    async def run_before(pilot):
        await until(pilot, lambda: len(pilot.app.runner.frame.snapshot.requests) == 8)
        pilot.app.query_one("#requests").focus()
        await pilot.pause(0.2)

    return app, run_before


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_main_screen_snapshot(snap_compare, size):
    app, run_before = _loaded_app(size)
    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.expect_errors("simulated kernel failure", "engine paused after an error")
async def test_engine_exception_is_shown_and_the_app_stays_usable():
    app = make_app()
    real_step = app.runner.engine.step
    calls = {"n": 0}

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated kernel failure")
        return real_step()

    app.runner.engine.step = flaky_step
    async with app.run_test(size=(120, 40)) as pilot:
        rid = await submit(pilot, "ROMEO:\n")
        await step(pilot, 1)
        app.runner.send(StepOnce())  # this one raises
        await until(pilot, lambda: any(e.kind == "error" for e in app.runner.frame.log))
        assert any("simulated kernel failure" in n.message for n in app._notifications)
        assert app.runner.paused
        await step(pilot, 3)  # still usable
        assert len(app.runner.frame.snapshot.request(rid).tokens) >= 3


async def test_slots_the_panel_cannot_draw_are_counted_on_its_last_row():
    """64 slots need 22 rows of 3 at 120 columns, the panel has 10: the last says what the 37 it
    cannot draw hold, and the requests seated in them are counted there (the grid used to cut them
    off unsaid); at 160x48 the same."""
    from tests.screen_check import check_panels

    app = make_app(kv="paged", slots=64, max_len=64, new=30, budget=256)
    async with app.run_test(size=(120, 40)) as pilot:
        for i in range(40):
            app.runner.send(Submit(f"{i}:", RequestSettings(Sampling(), 30)))
        await until(pilot, lambda: len(app.runner.frame.snapshot.requests) == 40, what="the 40 requests")
        await step(pilot, 2)
        snap = app.runner.frame.snapshot
        grid = app.query_one(SlotGrid)
        assert grid.size == (56, 10) and grid.shown() == 9 * 3  # 3 cells a row, the last row: the rest
        held = sum(sv.rid is not None for sv in snap.slots[27:])
        assert held == 13 and grid.render().plain.endswith("\n+37 more slots: 13 held, 24 free")  # (56 wide: no hint)
        assert grid.render().plain.count("\n") == 9
        check_panels(app)
        await pilot.resize_terminal(160, 48)
        await pilot.pause()
        check_panels(app)
        assert grid.shown() < 64 and "more slots" in grid.render().plain
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        check_panels(app)
        assert grid.render().plain.rsplit("\n", 1)[-1].endswith(" free")
        # at 80x24 the grid gives way to the request list: four rows of slots at most, the list
        # keeps six lines of requests (64 slots took 11 rows and left the list three)
        rows = app.query_one(RequestList).scrollable_content_region.height
        assert grid.size.height <= 4 and rows >= 6, (grid.size, rows)


async def test_the_sampling_shows_whole_in_the_pane_and_never_cut_mid_value_in_the_list():
    """T=0.8 k=20 p=0.95: the pane's header has room for it at 160 columns (it dropped it with
    cells to spare), the list's 13-cell column keeps whole words and says it left some out (it
    showed `p=` without its value)."""
    from dataclasses import replace as with_

    app = make_app(new=8)
    async with app.run_test(size=(160, 48)) as pilot:
        app.settings = with_(app.settings, sampling=Sampling(temperature=0.8, top_k=20, top_p=0.95))
        rid = await submit(pilot, "ROMEO:\n")
        await step(pilot, 3)
        frame = app.runner.frame
        await until(pilot, lambda: app._shown_seq == frame.seq)
        header = app.query_one("#pane-header").text.plain
        assert header.startswith(f"#{rid} running  slot ") and "  T=0.8 k=20 p=0.95  " in header
        row = app.query_one(RequestList).row_text(rid)
        assert " T=0.8 k=20… " in row and "p=" not in row


async def test_the_selected_request_stays_in_view_when_the_terminal_shrinks():
    """Selected near the end of a long list at 160x48, then 80x24: the list scrolls to keep the
    selected row in view (it showed rows above it, the selection hidden until a key moved it)."""
    app = make_app(slots=3)
    async with app.run_test(size=(160, 48)) as pilot:
        for i in range(40):
            app.runner.send(Submit(f"{i}:", RequestSettings(Sampling(), 12)))
        await until(pilot, lambda: len(app.runner.frame.snapshot.requests) == 40, what="the 40 requests")
        lst = app.query_one(RequestList)
        await until(pilot, lambda: lst.row_count == 40, what="the list's 40 rows")
        app.select(lst.rids[-3])
        await pilot.pause()
        for size in ((80, 24), (100, 30), (80, 24)):
            await pilot.resize_terminal(*size)
            await pilot.pause()
            await pilot.pause()
            top, visible = int(lst.scroll_offset.y), lst.scrollable_content_region.height - 1
            assert visible < 40 and top <= lst.cursor < top + visible, (size, top, visible, lst.cursor)
        assert lst.selected_rid() == lst.rids[-3] == app.selected


@pytest.mark.parametrize("flag", [None, ("finish", 123), ("preempt", 123), ("abort", 7), ("admit", 5)])
def test_every_slot_cell_is_the_same_width(flag):
    """Cells line up in columns whatever they say (a long 'preempted' once pushed its row over)."""
    from tinyllm.observe.snapshot import SlotView
    from tui.widgets.slot_grid import CELL_W

    grid = SlotGrid()
    grid.flags = {} if flag is None else {3: flag}
    for sv in (
        SlotView(slot=3, rid=None, context_len=0, capacity=512),
        SlotView(slot=3, rid=123, context_len=140, capacity=512),
        SlotView(slot=3, rid=5, context_len=7, capacity=512, blocks=(), just_admitted=True),
    ):
        assert sum(len(text) for text, _ in grid._cell(sv)) == CELL_W


# -- every key binding ---------------------------------------------------------------------------
BOUND = [(key, b.action) for b in TinyLLMApp.BINDINGS for key in b.key.split(",")]
ACTIVE = ("queued", "running", "preempted")
BASE_DELAY = 200  # ms/step between keys: a running request outlives several of them


class Before:
    """What a key's effect is judged against: the state just before it was pressed."""

    def __init__(self, app: TinyLLMApp):
        self.paused, self.delay, self.steps = app.runner.paused, app.runner.step_delay_ms, app.runner.steps_done
        self.selected, self.notes = app.selected, len(app.notified)
        self.timeline = app.query_one("#timeline").display
        self.panes = app.panes_on
        self.zoom = app.query_one("#timeline").zoom
        self.step = app.runner.frame.snapshot.counters.steps


def _noted(app: TinyLLMApp, was: Before, text: str) -> bool:
    return any(text in m for _, _, m in app.notified[was.notes :])


# action → what must hold once its key has acted. A new binding fails the test until it is added.
EFFECTS = {
    "help": lambda app, was: isinstance(app.screen, HelpScreen),
    "settings": lambda app, was: isinstance(app.screen, SettingsScreen),
    "load_prompts": lambda app, was: isinstance(app.screen, PromptPicker),
    "toggle_pause": lambda app, was: app.runner.paused != was.paused,
    "step_once": lambda app, was: (
        app.runner.steps_done == was.steps + 1
        if was.paused
        else any("works while paused" in m for _, _, m in app.notified[was.notes :])
    ),
    "slower": lambda app, was: app.runner.step_delay_ms > was.delay,
    "faster": lambda app, was: app.runner.step_delay_ms < was.delay,
    "abort_selected": lambda app, was: app.runner.frame.snapshot.request(was.selected).state == "aborted",
    "abort_all": lambda app, was: not any(r.state in ACTIVE for r in app.runner.frame.snapshot.requests),
    "clear_prefix_cache": lambda app, was: any("prefix cach" in e.text for e in app.runner.frame.log),
    "focus_input": lambda app, was: app.focused is app.query_one("#prompt"),
    "leave_input": lambda app, was: app.focused in (app.query_one("#requests"), app.query_one("#timeline")),
    "toggle_timeline": lambda app, was: app.query_one("#timeline").display != was.timeline,
    "toggle_panes": lambda app, was: app.panes_on != was.panes,
    "focus_log": lambda app, was: app.focused is app.query_one("#log") or _noted(app, was, "event log is hidden"),
    "zoom_out": lambda app, was: app.query_one("#timeline").zoom > was.zoom or _noted(app, was, "already at"),
    "zoom_in": lambda app, was: app.query_one("#timeline").zoom < was.zoom or _noted(app, was, "already at"),
    # replay only (tests/test_app_replay.py presses them there; a live app has them off)
    "step_back": lambda app, was: app.runner.frame.snapshot.counters.steps < was.step,
    "goto_step": lambda app, was: isinstance(app.screen, GotoStep),
    # (playing, it goes on from step 0 a step delay later: a busy machine's check can come after
    # that, so a step below the one before is the seek; the step it was at was far from the start)
    "replay_start": lambda app, was: (
        app.runner.frame.snapshot.counters.steps == 0 < was.step
        if was.paused
        else app.runner.frame.snapshot.counters.steps < was.step
    ),
    "replay_end": lambda app, was: app.runner.frame.snapshot.counters.steps == app.runner.last_step > was.step,
    "next_event": lambda app, was: app.runner.frame.snapshot.counters.steps > was.step or _noted(app, was, "has no"),
    "prev_event": lambda app, was: app.runner.frame.snapshot.counters.steps < was.step or _noted(app, was, "has no"),
    "race": lambda app, was: isinstance(app.screen, RaceScreen),  # escape closes it (tests/test_race_app.py)
    "quit": None,  # test_quit_keys_exit
}


async def ready(pilot, paused: bool) -> None:
    """Before each key: a live selected request with tokens to spare, the phase's pause state,
    BASE_DELAY, and the request list focused (letter keys are typed into the prompt otherwise)."""
    app = pilot.app
    v = app.selected is not None and app.runner.frame.snapshot.request(app.selected)
    if not (v and v.state in ACTIVE and v.max_new_tokens - len(v.tokens) > 20):
        app.select(await submit(pilot, "ROMEO:\n"))
    app.runner.send(SetPaused(paused))
    app.runner.send(SetDelay(BASE_DELAY))
    app.set_layout(False)  # (p switches to the panes view)
    app.query_one("#requests").focus()
    # the runner's own state as well as its frame: a frame published before the last key's
    # command was applied can already read (paused, BASE_DELAY) while that command is pending
    await until(
        pilot,
        lambda: (
            (app.runner.paused, app.runner.step_delay_ms, app.runner.frame.paused, app.runner.frame.step_delay_ms)
            == (paused, BASE_DELAY, paused, BASE_DELAY)
        ),
    )


@pytest.mark.parametrize("paused", [True, False], ids=["paused", "running"])
async def test_every_binding_acts_without_errors(paused):
    """Each key of each binding, paused or running; the no-error guard checks the log after.
    (One test per phase: the two run on both test workers at once.)"""
    assert not {action for _, action in BOUND} - EFFECTS.keys(), "add the new binding's effect to EFFECTS"
    app = make_app(new=100)
    async with app.run_test(size=(80, 24)) as pilot:
        for _ in (paused,):
            for key, action in BOUND:
                if EFFECTS[action] is None:
                    continue
                if action in TinyLLMApp.REPLAY_ONLY:  # off in a live app: pressing does nothing
                    assert app.check_action(action, ()) is False
                    continue
                await ready(pilot, paused)
                if action == "leave_input":
                    app.query_one("#prompt").focus()
                was = Before(app)
                await pilot.press(key)
                await until(
                    pilot,
                    lambda: EFFECTS[action](app, was),
                    what=f"{key!r} ({action}) to act while {'paused' if paused else 'running'}",
                )
                if len(app.screen_stack) > 1:
                    await pilot.press("escape")
                    await until(pilot, lambda: len(app.screen_stack) == 1, what=f"escape to close {key!r}")


@pytest.mark.parametrize("paused", [True, False], ids=["paused", "running"])
@pytest.mark.parametrize("key", [key for key, action in BOUND if action == "quit"])
async def test_quit_keys_exit(key, paused):
    """Quit keys end the app, so each gets its own (the bindings test above skips them). A
    request is running: the first press asks, the second quits (tests/test_app_quit.py)."""
    app = make_app(new=100)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot, paused)
        await pilot.press(key)
        assert app.is_running and type(app.screen).__name__ == "QuitConfirm"
        await pilot.press(key)
        assert app.return_code == 0, f"{key!r} did not quit"  # set by App.exit(), not by run_test
    assert app.runner._stop.is_set()


async def test_f1_toggles_help_and_dialogs_replace_it():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f1")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("f1")  # the app's F1 has priority: it closes
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen))
        await pilot.press("f1")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("f2")  # settings replace the help
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        assert not any(isinstance(s, HelpScreen) for s in app.screen_stack)
        await pilot.press("escape")
        await until(pilot, lambda: len(app.screen_stack) == 1)


class LoadingRunner(RunnerDefaults):
    mode = "live"
    """A runner whose engine is still loading (messages.Runner without an engine): what the app
    shows in the seconds a real engine process takes to import torch and read the weights."""
    device = "?"
    start_error = None

    def __init__(self, spec):
        self.frame = spec.loading_frame(128)
        self.sent = []

    def send(self, cmd):
        self.sent.append(cmd)

    @property
    def early_prompts(self) -> int:  # as ChildRunner: the prompts it holds for the engine
        return sum(type(c).__name__ == "Submit" for c in self.sent)

    def run(self, cancelled=lambda: False):
        while not cancelled():
            threading.Event().wait(0.02)

    def stop(self):
        pass


async def test_the_screen_is_up_while_the_engine_loads():
    from tinyllm.config import EngineConfig
    from tinyllm.model.checkpoint import default_model_dir
    from tui.runners.engine_spec import EngineSpec
    from tui.runners.interface import Submit

    spec = EngineSpec(str(default_model_dir()), EngineConfig(max_num_seqs=4, max_len=128, kv="paged", block_size=8))
    runner = LoadingRunner(spec)
    app = TinyLLMApp(runner, bundled()[1], model_name="test", settings=RequestSettings(Sampling(), 12))
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: "LOADING" in app.query_one("#status").render().plain, what="the first frame")
        assert "engine loading" in app.query_one("#status").render().plain
        grid = app.query_one(SlotGrid).render().plain
        assert grid.count("free") == 4
        await pilot.press("i")
        app.query_one("#prompt").value = "ROMEO:"
        await pilot.press("enter")  # typed while loading: kept, not lost
        await until(pilot, lambda: any(isinstance(c, Submit) for c in runner.sent), what="the prompt sent")
        assert [type(c) for c in runner.sent if isinstance(c, Submit)] == [Submit]
        status = app.query_one("#status").render().plain  # the screen says it waits (it stayed the same)
        assert "1 prompt waits for the engine" in status, status
        app.query_one("#prompt").value = "JULIET:"
        await pilot.press("enter")
        await until(pilot, lambda: "2 prompts wait for the engine" in app.query_one("#status").render().plain)
        assert not [n for n in app._notifications if n.severity == "error"]
        worker_cancelled = [w for w in app.workers if w.name == "engine"]
    assert all(w.is_cancelled or w.is_finished for w in worker_cancelled)


async def test_chunked_prefill_is_visible_step_by_step():
    """A prompt longer than the budget is prefilled over several steps: the slot shows '▸' and
    its computed length growing, the log names each chunk, the status line the budget."""
    app = make_app(kv="paged", slots=2, budget=4, new=6)
    async with app.run_test(size=(120, 40)) as pilot:
        rid = await submit(pilot, "ROMEO:\nBut soft, what light through yonder window breaks?")
        n_prompt = len(app.runner.frame.snapshot.request(rid).prompt)
        assert n_prompt > 8
        assert "chunked ≤4 tok/step" in app.query_one("#status").render().plain
        seen = []
        for _ in range(-(-n_prompt // 4) - 1):
            await step(pilot)
            sv = app.runner.frame.snapshot.slots[0]
            seen.append(sv.context_len)
            assert sv.rid == rid and sv.prefill_left == n_prompt - sv.context_len > 0
            assert "▹" in app.query_one(SlotGrid).render().plain  # the prefill bar
            assert not app.runner.frame.snapshot.request(rid).tokens
        assert seen == list(range(4, 4 * len(seen) + 1, 4))
        await step(pilot)  # the last chunk samples
        assert len(app.runner.frame.snapshot.request(rid).tokens) == 1
        assert app.runner.frame.snapshot.slots[0].prefill_left == 0
        chunks = [e.text for e in app.runner.frame.log if e.kind == "prefill"]
        assert chunks[0] == f"#{rid} prefill chunk 0..4 of {n_prompt} tokens" and len(chunks) == -(-n_prompt // 4)


async def test_settings_dialog_shows_the_engines_scheduler():
    app = make_app(kv="paged", slots=2, budget=4)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        line = str(app.screen.query_one("#settings-engine").render())
        assert "2 slots, paged KV, chunked prefill, ≤4 tokens/step" in line
        assert app.screen.query_one("#apply").region.bottom <= 24  # still fits 80x24
        await pilot.press("escape")


async def test_prefix_cache_is_visible_and_clearable():
    """Requests sharing a long prefix: the admission event says how many tokens came from the
    cache, the pane shows them, the block map shows shared (▣) then cached-free (○) blocks, the
    counters the hit rate; `c` clears the cache."""
    app = make_app(kv="paged", slots=3, max_len=256, budget=64, new=4)
    header = "SCENE II. Verona. A public place.\nEnter SAMPSON and GREGORY, armed.\n" * 3
    async with app.run_test(size=(160, 48)) as pilot:
        a = await submit(pilot, header + "ROMEO:")
        await step(pilot, 2)
        b = await submit(pilot, header + "JULIET:")
        await step(pilot, 1)
        snap = app.runner.frame.snapshot
        assert snap.request(b).cached_tokens > 0 and snap.request(b).cached_tokens % 8 == 0
        assert any(r > 1 for r in snap.kv.block_refs)
        assert "▣" in app.query_one(BlockMap).render().plain
        assert (
            f"{snap.request(b).cached_tokens} cached"
            in app.query_one(RequestPane).query_one("#pane-header").render().plain
        )
        admits = [e.text for e in app.runner.frame.log if e.kind == "admit" and e.rid == b]
        assert admits and f"{snap.request(b).cached_tokens} of " in admits[0] and "from the prefix cache" in admits[0]
        panel = "".join(seg.text for seg in app.console.render(app.query_one(KVPanel).render()))
        assert "prefix hit" in panel
        await step(pilot, 10)  # both finish: blocks free but cached
        snap = app.runner.frame.snapshot
        assert snap.kv.cached_free_blocks > 0 and "○" in app.query_one(BlockMap).render().plain
        app.query_one("#requests").focus()
        await pilot.press("c")
        await until(pilot, lambda: app.runner.frame.snapshot.kv.cached_free_blocks == 0)
        assert any(e.text.startswith("prefix cache cleared") for e in app.runner.frame.log)
        assert a != b


def test_a_loaded_workload_says_its_requests_and_the_sequences_their_samples_make():
    """F3 on a file with one line asking n=3 said `loaded n3.jsonl: 1 requests` and ran three."""
    from tinyllm.workload import WorkItem
    from tui.runners.interface import LoadWorkload

    one = LoadWorkload("n3.jsonl", (WorkItem("ROMEO:", n=3),), ((1, 2),), RequestSettings(Sampling(), 8))
    assert one.loaded() == "loaded n3.jsonl: 1 request (3 sequences with their samples)"
    two = LoadWorkload("b.jsonl", (WorkItem("A"), WorkItem("B")), ((1,), (2,)), RequestSettings(Sampling(), 8))
    assert two.loaded() == "loaded b.jsonl: 2 requests"
