"""The panes view (issue 49): one pane per slot, each writing its request's text, driven by Pilot
with real key presses.

Every check holds each pane on the screen to the snapshot it was drawn from: the request in each
slot, its state, tokens and the text (prompt then generation) it shows, the request that left a
slot kept there until the slot is taken, the count of panes off screen, the selected request's
heavy frame; live and in a replay moved back and forth, at 80x24, 120x36 and 200x50. Waits are for
events (a frame, a step), never for time. Uses test_app's helpers and its no-error guard.
"""

from __future__ import annotations

import random
import re

import pytest
from rich.cells import cell_len

from tests.screen_check import check_panels, drawn_frame
from tests.test_app import _watch, make_app, no_unexpected_errors, step, until  # noqa: F401
from tests.test_app_fit import SIZES, busy_app, run_until, screen_lines
from tests.test_app_replay import RECORDING, goto, replay_app
from tests.test_attach_vllm import WORDS, fake, vllm_app  # noqa: F401  (a fake vLLM server)
from tinyllm.observe.snapshot import RequestView
from tinyllm.request import Sampling
from tinyllm.workload import bundled_workloads
from tui.cli import build_app
from tui.runners.interface import Frame, Submit
from tui.widgets.panes import PanesView, tile
from tui.widgets.panes_model import SLOT_EVENTS, panes_of
from tui.widgets.panes_text import Wrapped, clean
from tui.widgets.request_list import RequestList
from tui.widgets.request_pane import RequestPane


def cells(line: str, x0: int, x1: int) -> str:
    """The characters of ``line`` in cells x0..x1 (a wide character takes two)."""
    out, x = [], 0
    for ch in line:
        if x0 <= x < x1:
            out.append(ch)
        x += cell_len(ch)
    return "".join(out)


def squash(text: str) -> str:
    """Text without its whitespace: wrapping moves spaces and newlines, never other characters."""
    return re.sub(r"\s+", "", text)


def check_panes(app) -> Frame:
    """Assert the panes view shows the frame the app last drew, pane by pane, as on the screen."""
    frame = drawn_frame(app)
    view = app.query_one(PanesView)
    assert app.panes_on and view.frame is frame, "the panes show another frame"
    snap = frame.snapshot
    status = app.query_one("#status").text.plain
    assert app.metrics_only or f"step {snap.counters.steps}" in status, status
    panes = view.panes
    rids = [p.rid for p in panes]
    assert len(rids) == len(set(rids)), f"a request in two panes: {rids}"
    if snap.slots:
        assert [p.lane for p in panes] == sorted(p.lane for p in panes), "panes out of slot order"
        by_slot = {p.lane: p for p in panes}
        for sv in snap.slots:
            if sv.rid is not None:  # every held slot has its request's pane
                assert by_slot[sv.slot].rid == sv.rid and by_slot[sv.slot].holds, f"slot {sv.slot}"
            elif sv.slot in by_slot:  # a freed slot: the request that left it last, until it is taken
                p = by_slot[sv.slot]
                v = snap.request(p.rid)
                assert not p.holds and v.slot is None and v.state != "running"
                named = [e for e in frame.log if e.slot == sv.slot and e.rid is not None and e.kind in SLOT_EVENTS]
                assert named and named[-1].rid == p.rid, f"slot {sv.slot} was last #{named[-1].rid}, shows #{p.rid}"
    shown = view.visible()
    assert shown == panes[view.page * view.per_page() :][: view.per_page()]
    header = view.header_text()
    off = len(panes) - len(shown)
    assert (f"{off} more off screen" in header) == bool(off), header
    if not shown:
        assert "No request" in "".join(screen_lines(app)), "the empty view says how to start"
    screen = screen_lines(app)
    for i, p in enumerate(shown):
        lines = view.pane_lines(p.lane)
        cell = view._cell(i).translate(view.content_region.offset)
        for y, line in enumerate(lines):  # the terminal shows exactly these lines
            assert cells(screen[cell.y + y], cell.x, cell.right) == line, (p.lane, y, line)
        v = snap.request(p.rid)
        title = lines[0]
        assert title.startswith("┏" if p.rid == app.selected else "╭"), f"#{p.rid}'s frame: {title}"
        assert f" #{v.rid} · " in title, title
        state = f"prefill {100 * p.prefill[0] // p.prefill[1]}%" if p.prefill else v.state
        assert f" · {state} · " in title, (state, title)
        assert f"{len(v.tokens)}/{v.max_new_tokens} tok" in title, title
        if not p.holds and v.state == "preempted":
            assert "waiting" in lines[-1], lines[-1]
        elif not p.holds and v.state == "finished":
            assert "✓ done" in lines[-1], lines[-1]
        body = "".join(line[2:-2] for line in lines[1:-1])
        source = clean(frame.prompts.get(v.rid, "") + frame.texts.get(v.rid, ""))
        assert squash(source).endswith(squash(body)), f"#{v.rid}: {body!r} is not the end of {source[-200:]!r}"
        wrapped = Wrapped(cell.width - 4)
        wrapped.reset(source)
        if len(wrapped.lines) <= len(lines) - 2:  # it all fits: all of it, from its first character
            assert squash(body) == squash(source), (body, source)
    return frame


async def to_panes(pilot) -> None:
    """Press p (from the list, where letters are keys) and wait for the panes' first frame."""
    app = pilot.app
    if not app.panes_on:
        app.screen.set_focus(app.query_one(RequestList))
        await pilot.press("p")
    await until(pilot, lambda: app.panes_on and app.query_one(PanesView).frame is app._details_frame, what="panes")
    await until(pilot, lambda: app._shown_seq == app.runner.frame.seq, what="the frame drawn")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_each_pane_is_its_slots_request_as_the_snapshot_has_it(size):
    """A busy paged pool (finishes, preemptions, chunked prefill): after the run, and step by step
    from there, every pane against its frame; p goes to the list view and back."""
    app = busy_app(panes=True)
    async with app.run_test(size=size) as pilot:
        await run_until(pilot, lambda f: f.snapshot.counters.preemptions and f.snapshot.counters.finished >= 2, "it")
        await to_panes(pilot)
        check_panes(app)
        for _ in range(6):
            await step(pilot)
            await until(pilot, lambda: app._shown_seq == app.runner.frame.seq, what="the step drawn")
            check_panes(app)
        await pilot.press("p")
        await until(pilot, lambda: not app.panes_on and app._shown_seq == app.runner.frame.seq, what="the list")
        await until(
            pilot, lambda: app.query_one(RequestList).rids == tuple(v.rid for v in app.runner.frame.snapshot.requests)
        )
        check_panels(app)
        await to_panes(pilot)
        check_panes(app)


async def test_a_finished_request_keeps_its_pane_until_its_slot_is_taken():
    """Two slots, three requests: the first two finish and stay in their panes (dimmed, 'done'),
    then the third takes slot 0 and its pane shows the newcomer."""
    app = make_app(slots=2, new=6, panes=True)
    async with app.run_test(size=(120, 36)) as pilot:
        for text in ("ROMEO:", "JULIET:", "HAMLET:"):
            app.runner.send(Submit(text, app.settings))
        await until(pilot, lambda: len(app.runner.frame.snapshot.requests) == 3, what="the requests")
        await to_panes(pilot)
        view = app.query_one(PanesView)
        await until(pilot, lambda: not view.panes, what="no pane before any admission")
        check_panes(app)
        while not all(v.state == "finished" for v in app.runner.frame.snapshot.requests[:2]):
            await step(pilot)
            await until(pilot, lambda: app._shown_seq == app.runner.frame.seq)
            check_panes(app)
        assert [(p.lane, p.rid, p.holds) for p in view.panes] == [(0, 0, False), (1, 1, False)]
        assert "✓ done" in view.pane_lines(0)[-1]
        await step(pilot)
        await until(pilot, lambda: app._shown_seq == app.runner.frame.seq)
        check_panes(app)
        assert [(p.lane, p.rid, p.holds) for p in view.panes] == [(0, 2, True), (1, 1, False)]
        assert "HAMLET:" in "".join(view.pane_lines(0)) and "ROMEO" not in "".join(view.pane_lines(0))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_a_replay_moved_back_shows_the_panes_as_they_were(size):
    """In a recording with preemptions and an abort: to the end, then back step by step and by
    jumps to earlier steps, each frame's panes are that step's."""
    app = replay_app()
    r = app.runner
    async with app.run_test(size=size) as pilot:
        await to_panes(pilot)
        await pilot.press("greater_than_sign")
        await until(pilot, lambda: r.step == r.last_step, what="the end")
        await until(pilot, lambda: app._shown_seq == r.frame.seq)
        check_panes(app)
        seen_waiting = False
        for n in (40, 31, 30, 22, 12, 5):
            await goto(pilot, n)
            await to_panes(pilot)
            check_panes(app)
            for _ in range(2):
                before = r.step
                await pilot.press("b")
                await until(pilot, lambda: r.step == before - 1 and app._shown_seq == r.frame.seq, what="b")
                frame = check_panes(app)
                seen_waiting |= any(not p.holds and p.state == "preempted" for p in panes_of(frame))
        assert seen_waiting, "no step of the recording showed a preempted request waiting in its pane"
        await pilot.press("less_than_sign")
        await until(pilot, lambda: r.step == 0 and app._shown_seq == r.frame.seq, what="the start")
        check_panes(app)


async def test_more_panes_than_fit_page_with_keys():
    """Twelve slots in 80x24: eight panes and 'N more off screen'; PgDn shows the rest, PgUp,
    Home and End move back and forth; ↓ past the page's last row turns the page."""
    app = make_app(kv="paged", slots=12, max_len=256, new=40, prompts_file=bundled_workloads()["burst"], panes=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await run_until(pilot, lambda f: f.snapshot.num_requests_running == 12, "twelve running")
        await to_panes(pilot)
        view = app.query_one(PanesView)
        assert view.per_page() == 8 and len(view.panes) == 12 and view.page == 0
        check_panes(app)
        assert "4 more off screen" in view.header_text()
        await pilot.press("pagedown")
        await until(pilot, lambda: view.page == 1)
        await pilot.pause()
        check_panes(app)
        assert [p.lane for p in view.visible()] == list(range(8, 12)) and "panes 9–12 of 12" in view.header_text()
        await pilot.press("pageup")
        await until(pilot, lambda: view.page == 0)
        await pilot.press("end")
        await until(pilot, lambda: view.page == 1)
        await pilot.press("home")
        await until(pilot, lambda: view.page == 0)
        app.select(view.panes[0].rid)  # (from the first pane: the selection followed the newest request)
        await pilot.press("right", "left")
        await until(pilot, lambda: app.selected == view.panes[0].rid)
        for _ in range(3):
            await pilot.press("down")
        await until(pilot, lambda: app.selected == view.panes[6].rid, what="the last row's first pane")
        await pilot.press("down")
        await until(pilot, lambda: view.page == 1 and app.selected == view.panes[8].rid, what="the next page")
        await pilot.pause()
        check_panes(app)


async def test_enter_on_a_pane_selects_its_request_in_the_list_and_the_detail_pane():
    app = busy_app(panes=True)
    async with app.run_test(size=(120, 36)) as pilot:
        await run_until(pilot, lambda f: f.snapshot.num_requests_running >= 3, "three running")
        await to_panes(pilot)
        view = app.query_one(PanesView)
        app.select(view.panes[0].rid)  # (from the first pane: the selection followed the newest request)
        await pilot.press("right")
        rid = view.panes[1].rid
        await until(pilot, lambda: app.selected == rid and view.selected == rid, what="the second pane")
        await pilot.pause()
        check_panes(app)  # its frame is the heavy one
        cell = view._cell(2)
        await pilot.click("#panes", offset=(cell.x + 3, cell.y + 2))  # a click selects too
        await until(pilot, lambda: app.selected == view.panes[2].rid, what="the clicked pane")
        await pilot.press("left")  # back one pane in slot order (from a row's first: the row above's last)
        await until(pilot, lambda: app.selected == rid, what="back to the second pane")
        await pilot.press("enter")
        await until(pilot, lambda: not app.panes_on and app._shown_seq == app.runner.frame.seq, what="the list view")
        await until(pilot, lambda: app.query_one(RequestList).selected_rid() == rid, what="the list's cursor")
        assert app.selected == rid and isinstance(app.focused, RequestList)
        assert app.query_one(RequestPane).query_one("#pane-header").text.plain.startswith(f"#{rid} ")
        check_panels(app)


async def test_started_with_panes_the_keys_go_to_the_panes():
    """--panes on a replay: the panes have the keys (not the hidden list); t and e bring the list
    view back with the timeline or the event log focused, p the panes again."""
    app = build_app(["--replay", str(RECORDING), "--panes"])
    _watch(app)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.panes_on and isinstance(app.focused, PanesView), what="the panes' focus")
        await pilot.press("t")
        await until(pilot, lambda: not app.panes_on and app.focused is app.query_one("#timeline"), what="t")
        await pilot.press("p", "e")
        await until(pilot, lambda: not app.panes_on and app.focused is app.query_one("#log"), what="e")
        await pilot.press("p")
        await until(pilot, lambda: app.panes_on and isinstance(app.focused, PanesView), what="p")


async def test_the_palette_and_the_help_offer_the_panes():
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("ctrl+p")
        await until(pilot, lambda: len(app.screen_stack) > 1, what="the palette")
        await pilot.press(*"panes", "enter")
        await until(pilot, lambda: app.panes_on, what="the panes view")
        await pilot.press("escape", "f1")  # (out of the prompt editor, then the help)
        await until(pilot, lambda: len(app.screen_stack) > 1, what="the help")
        rows = dict(app.screen.rows())
        assert rows["p"].startswith("the panes view") and rows["enter (panes)"].startswith("open")


async def test_attached_to_vllm_each_of_the_apps_requests_gets_a_lane(fake):
    app = vllm_app(fake.url)
    async with app.run_test(size=(120, 36)) as pilot:
        app.runner.send(Submit("ROMEO:", app.settings))
        await until(pilot, lambda: app.runner.frame.snapshot.requests, what="the request")
        await until(pilot, lambda: app.runner.frame.snapshot.requests[0].state == "finished", what="the stream")
        await to_panes(pilot)
        view = app.query_one(PanesView)
        assert [(p.lane, p.rid, p.slotted) for p in view.panes] == [(0, 0, False)]
        lines = view.pane_lines(0)
        assert " #0 · finished · 10/10 tok" in lines[0] and "✓ done" in lines[-1]
        assert squash("".join(line[2:-2] for line in lines[1:-1])).endswith(squash("".join(WORDS)))


# -- the parts, without the app ---------------------------------------------------------------------------
def test_text_wrapped_as_it_grows_is_wrapped_as_a_whole():
    """Appending a token at a time gives exactly the lines of wrapping the whole text at once, wide
    characters and long words included; no line is wider than the pane."""
    rng = random.Random(0)
    words = ["a", "the", "King", "中文字", "supercalifragilistic", "[bold]", "\n", "  ", "é", "—"]
    for width in (2, 3, 7, 26):
        text = "".join(rng.choice(words) + rng.choice([" ", "", "\n"]) for _ in range(300))
        grown = Wrapped(width)
        for i in range(0, len(text), 3):
            grown.extend(text[i : i + 3])
        whole = Wrapped(width)
        whole.reset(text)
        assert grown.lines == whole.lines and grown.source == text
        assert all(cell_len(text[a:b]) <= width for a, b in whole.lines)
        assert squash("".join(text[a:b] for a, b in whole.lines)) == squash(text)


def test_generated_text_reaches_the_terminal_as_plain_characters():
    assert clean("a\x1b[31mred\x07\tb\r\n[bold]x[/]") == "a[31mred b\n[bold]x[/]"


def test_panes_tile_at_a_readable_size():
    assert tile(8, 80, 20) == (2, 4)  # 80x24: 38-cell lines, 3 lines each
    assert tile(8, 120, 32) == (2, 4)
    assert tile(1, 120, 32) == (1, 1)
    assert tile(3, 200, 46) == (3, 1)
    cols, rows = tile(64, 200, 46)
    assert 200 // cols >= 30 and 46 // rows >= 5 and cols * rows < 64  # as many as fit, paged


def test_lanes_without_slots_go_to_the_lowest_one_free_at_arrival():
    """A server without slots (vLLM): a request takes the lowest lane whose request had ended when
    it arrived; a lane shows its newest request."""

    def view(rid, arrival, state="running", finish=None):
        return RequestView(
            rid=rid,
            state=state,
            slot=None,
            prompt=(),
            tokens=(1,),
            max_new_tokens=8,
            sampling=Sampling(),
            eos_id=None,
            arrival_s=arrival,
            first_token_s=arrival,
            finish_s=finish,
            preemptions=0,
        )

    from dataclasses import replace

    from tinyllm.observe.snapshot import EngineSnapshot, KVView

    reqs = (view(0, 0.0, "finished", 2.0), view(1, 1.0), view(2, 3.0), view(3, 3.5, "finished", 4.0), view(4, 5.0))
    snap = replace(EngineSnapshot.empty(KVView.empty("slots"), max_len=64), time_s=6.0, requests=reqs)
    frame = replace(Frame.loading(snap), seq=1, paused=True, status="ready")
    assert [(p.lane, p.rid, p.holds) for p in panes_of(frame)] == [(0, 2, True), (1, 1, True), (2, 4, True)]
