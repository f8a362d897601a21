"""Abort acts on what the user sees (issue 44, item 6): the selection follows the newest request
unless the user moved it, and a request already done is not offered for abort (attached, the
selection stayed on an older finished request; x asked 'Abort #4?' for it, then said there was
nothing to abort).

Uses test_app's helpers and its no-error guard (every app a test makes is watched)."""

from __future__ import annotations

import httpx

from tests.test_app import make_app, no_unexpected_errors, step, submit, submit_and_step, until  # noqa: F401
from tests.test_attach import asked, long_app, ours_and_another, slow  # noqa: F401
from tinyllm.request import RequestSettings, Sampling
from tui.runners.interface import Abort, Submit


def newest(app) -> int:
    return max(v.rid for v in app.runner.frame.snapshot.requests)


async def arrive(pilot, text: str) -> int:
    """A request that was not typed (a workload's arrival, another client's): its id, once shown."""
    app = pilot.app
    n = len(app.runner.frame.snapshot.requests)
    app.runner.send(Submit(text, RequestSettings(Sampling(), 100), tuple(app.tokenizer.encode(text))))
    await until(pilot, lambda: len(app.runner.frame.snapshot.requests) > n, what=f"{text} to arrive")
    return newest(app)


async def test_the_selection_follows_the_newest_request_until_the_user_moves_it():
    app = make_app(new=100)
    async with app.run_test(size=(120, 36)) as pilot:
        a = await submit(pilot, "ROMEO:")
        b = await submit(pilot, "JULIET:")
        assert app.selected == b
        c = await arrive(pilot, "NURSE:")
        assert app.selected == c  # the newest, typed or not
        await pilot.press("escape", "up", "up")  # the user moves it: it stays
        await until(pilot, lambda: app.selected == a, what="up to #a")
        await arrive(pilot, "KING:")
        await step(pilot, 2)
        assert app.selected == a
        await pilot.press("end")  # back on the newest: it follows
        d = await arrive(pilot, "QUEEN:")
        assert app.selected == d
        await pilot.press("up")
        await pilot.press("i", *"HAMLET:", "enter")  # a prompt sent: it is followed
        await until(pilot, lambda: newest(app) > d, what="the prompt's request")
        await until(pilot, lambda: app.selected == newest(app), what="the selection on it")


async def test_a_request_already_done_is_not_offered_for_abort():
    app = make_app(new=3)
    async with app.run_test(size=(120, 36)) as pilot:
        v = await submit_and_step(pilot, "ROMEO:", 5)
        assert v.state == "finished" and app.selected == v.rid
        sent = []
        send = app.runner.send
        app.runner.send = lambda cmd: sent.append(cmd) or send(cmd)
        await pilot.press("escape", "x")
        assert any(f"#{v.rid} is finished: nothing to abort" in m for _, _, m in app.notified)
        assert not [c for c in sent if isinstance(c, Abort)] and len(app.screen_stack) == 1


async def test_attached_a_request_that_ends_while_the_question_is_up_is_not_aborted(slow):
    """Another client's request, x, 'Abort #n?'; it ends meanwhile (here an operator aborts it):
    y then says so instead of sending an abort for a request that is done."""
    app = long_app(slow.url)
    async with app.run_test(size=(120, 36)) as pilot:
        ours, theirs = await ours_and_another(pilot)
        app.select(theirs)
        assert "another client" in await asked(pilot, "escape", "x")
        httpx.post(slow.url + "/v1/tinyllm/abort", json={"rids": [theirs]}, timeout=10).raise_for_status()
        await until(pilot, lambda: app.runner.frame.snapshot.request(theirs).state == "aborted", what="theirs ended")
        await pilot.press("y")
        assert any(f"#{theirs} is aborted: nothing to abort" in m for _, _, m in app.notified)
        assert app.runner.frame.snapshot.request(ours).state == "running"
