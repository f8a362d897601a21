"""Deferred callbacks (``call_after_refresh``, timers, posted messages) that outlive the screen
or widget that queued them do nothing (issue 44, item 9).

The race screen's ``_place_track``, queued with ``call_after_refresh`` by the frame it drew last,
ran once the screen had been popped: Textual removes a popped screen's widgets one by one while
the screen itself is still attached, and ``query_one("#race-status")`` raised NoMatches (1 run
in 1,203 beside a busy core; a traceback for a user who opens and leaves the race quickly). The
tests hold the callbacks back and run them exactly in that window, so they do not depend on
the machine's speed."""

from __future__ import annotations

import sys

from textual.message_pump import MessagePump

from tests.test_app import make_app, no_unexpected_errors, submit, until  # noqa: F401
from tui.screens.race import RaceScreen
from tui.widgets.selection import RequestSelected


async def test_the_race_screens_deferred_callbacks_do_nothing_once_it_is_leaving(monkeypatch):
    """Press r, then Escape, with the race's last frame's deferred callbacks run when its widgets
    have gone and the screen is still attached (its on_unmount: the moment the crash happened)."""
    held: list = []
    seen: dict = {}
    unmount = RaceScreen.on_unmount

    def on_unmount(screen) -> None:
        seen["attached"] = screen.is_attached
        seen["widgets"] = len(screen.query("#race-status"))
        for callback, args, kwargs in held:
            callback(*args, **kwargs)  # raised NoMatches before the fix
        seen["ran"] = len(held)
        unmount(screen)

    monkeypatch.setattr(RaceScreen, "on_unmount", on_unmount)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.query_one("#requests").focus()
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, RaceScreen))
        race = app.screen
        race.call_after_refresh = lambda callback, *a, **kw: held.append((callback, a, kw)) or True
        race.refresh_from_runner(force=True)  # the race's own drawing queues them
        assert held, "the race queued no deferred callback: the test no longer tests anything"
        await pilot.press("escape")
        await until(pilot, lambda: "ran" in seen, what="the race screen to unmount")
        assert not isinstance(app.screen, RaceScreen)
        assert seen == {"attached": True, "widgets": 0, "ran": len(held)}  # the window the crash was in
    assert app.return_code in (None, 0)


async def test_every_callback_the_app_deferred_does_nothing_once_the_app_has_gone(monkeypatch):
    """Every ``call_after_refresh`` of the app and its widgets (the list's cursor after a resize,
    the pane's scroll, the app's redraw after a resize) and a list selection posted as a message,
    run after the app has exited: nothing raises."""
    queued: list = []
    real = MessagePump.call_after_refresh

    def recording(node, callback, *a, **kw):
        if sys._getframe(1).f_globals["__name__"].startswith("tui."):  # the app's own, not Textual's
            queued.append((callback, a, kw))
        return real(node, callback, *a, **kw)

    monkeypatch.setattr(MessagePump, "call_after_refresh", recording)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await submit(pilot, "ROMEO:\n")
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: app.size.width == 80, what="the resize")
    kinds = {getattr(callback, "__name__", "") for callback, _, _ in queued}
    assert {"_cursor_into_view", "refresh_from_runner", "scroll_end"} <= kinds, kinds
    with app._context():  # as Textual runs them: in the app's context
        for callback, a, kw in queued:
            callback(*a, **kw)
        app.on_request_selected(RequestSelected(0))  # a message the list posted, handled late
        app._tick()  # a timer's last tick
