"""Keys typed before the app takes the terminal keep their meaning.

Until Textual puts the terminal in raw mode (a few tenths of a second after the command starts:
imports, the checks, the app's build), the terminal's line discipline still translates what
arrives: with ICRNL set, Enter's carriage return is stored as a line feed, which the app then
reads as Ctrl+J, the editor's "new line". A prompt typed and sent at once ("ROMEO:" then Enter,
the usual first thing) would sit in the editor with an empty second line instead of being sent.
Clearing ICRNL as early as the command can keeps Enter an Enter, and clearing ECHO keeps what is
typed off the shell's screen (the editor shows it once the app is up; a CR echoed '^M'). The
terminal's settings are put back exactly as they were when the app is done (Textual restores the
ones it found, ours). A command started in the background leaves them alone: changing them there
would stop it (SIGTTOU), as Textual's own driver knows."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def enter_stays_enter(stream=None) -> Iterator[None]:
    """While inside: the terminal on ``stream`` (stdin) keeps a typed carriage return as one and
    does not echo. Nothing happens where it is not a terminal, this process is not in its
    foreground, or there is no termios (Windows)."""
    stream = sys.stdin if stream is None else stream
    try:
        import termios
    except ImportError:  # (Windows)
        yield
        return
    try:
        fd = stream.fileno()
        before = termios.tcgetattr(fd) if stream.isatty() and not in_background(fd) else None
        if before is not None:
            changed = list(before)
            changed[0] &= ~termios.ICRNL  # iflag
            changed[3] &= ~termios.ECHO  # lflag; TCSANOW, not TCSAFLUSH: the keys already typed are kept
            termios.tcsetattr(fd, termios.TCSANOW, changed)
    except (AttributeError, ValueError, OSError, termios.error):
        before = None
    if before is None:
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError, termios.error):  # (a terminal that went away)
            termios.tcsetattr(fd, termios.TCSANOW, before)


def in_background(fd: int) -> bool:
    """Whether this process is a background job of the terminal on ``fd`` (where changing its
    settings would stop the process); not where it is another terminal than the process's own."""
    try:
        return os.tcgetpgrp(fd) != os.getpgrp()
    except OSError:  # not the controlling terminal: no job control on it
        return False
