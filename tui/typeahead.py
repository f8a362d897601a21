"""Keys typed before the app takes the terminal keep their meaning.

Until Textual puts the terminal in raw mode (a few tenths of a second after the command starts:
imports, the checks, the app's build), the terminal's line discipline still translates what
arrives: with ICRNL set, Enter's carriage return is stored as a line feed, which the app then
reads as Ctrl+J, the editor's "new line". A prompt typed and sent at once ("ROMEO:" then Enter,
the usual first thing) would sit in the editor with an empty second line instead of being sent.
Clearing ICRNL as early as the command can keeps Enter an Enter; the terminal's settings are put
back exactly as they were when the app is done (Textual restores the ones it found, ours)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def enter_stays_enter(stream=None) -> Iterator[None]:
    """While inside: the terminal on ``stream`` (stdin) keeps a typed carriage return as one.
    Nothing happens where it is not a terminal or there is no termios (Windows)."""
    stream = sys.stdin if stream is None else stream
    try:
        import termios

        fd = stream.fileno()
        before = termios.tcgetattr(fd) if stream.isatty() else None
    except (ImportError, AttributeError, ValueError, OSError):
        before = None
    if before is None:
        yield
        return
    changed = list(before)
    changed[0] &= ~termios.ICRNL  # iflag; TCSANOW, not TCSAFLUSH: the keys already typed are kept
    termios.tcsetattr(fd, termios.TCSANOW, changed)
    try:
        yield
    finally:
        with contextlib.suppress(OSError, termios.error):  # (a terminal that went away)
            termios.tcsetattr(fd, termios.TCSANOW, before)
