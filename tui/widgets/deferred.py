"""Deferred callbacks that outlive their widget, screen or app do nothing.

A callback queued with ``call_after_refresh``, a timer's tick, or a message a widget posted can
run after what queued it has started to leave: a screen popped while its last frame's
``call_after_refresh`` waited for the next repaint runs it from the screen below, while Textual
removes the popped screen's widgets one by one and the screen itself is still attached, so a
``query_one`` raised ``NoMatches`` (the race screen's ``_place_track``: a traceback for a user who
opened and left the race quickly on a busy machine). Every deferred callback in the app goes
through ``@deferred`` (a method of the node that runs it) or ``guarded(node, fn)`` (another
callable), which do nothing once ``gone(node)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from textual.app import App


def gone(node) -> bool:
    """Whether ``node`` (a widget, a screen or the app) has left, or has started to leave: its
    removal sets ``_pruning`` at once, before its children go, and stays attached until they have;
    an app is leaving from ``exit()`` (or a test's shutdown) on."""
    if isinstance(node, App):
        return node._exit or not node._running or node._closing or node._closed
    return not node.is_attached or node._pruning or node._closing or node._closed


def guarded(node, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, to be called later, that does nothing if ``node`` is gone by then."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if not gone(node):
            return fn(*args, **kwargs)
        return None

    return run


def deferred(method: Callable[..., Any]) -> Callable[..., Any]:
    """A method that runs deferred (a timer's, ``call_after_refresh``'s, a message handler's):
    it does nothing once its object is gone."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        if not gone(self):
            return method(self, *args, **kwargs)
        return None

    return run
