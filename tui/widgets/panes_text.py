"""A pane's text, wrapped to its width as it grows, for line-API drawing.

Generated text only ever grows while a request runs, so a ``Wrapped`` re-wraps only its last line
and the new characters on each frame (greedy wrapping closes a line for good once a character
does not fit, so earlier lines never change). Anything else (a replay moved back, another request
in the pane, a new width) wraps afresh. The text is drawn as plain segments, never markup: a
``[`` shows as itself, and control characters (an escape sequence in generated text would reach
the terminal) are dropped, tabs become spaces.
"""

from __future__ import annotations

from rich.cells import get_character_cell_size

# C0 controls but newline, DEL and C1 controls: dropped; a tab: one space
_CONTROLS = {c: None for c in (*range(32), 127, *range(128, 160)) if c != 10} | {9: " "}


def clean(text: str) -> str:
    """``text`` with nothing a terminal would act on: only newlines and printable characters."""
    return text.translate(_CONTROLS)


def _cells(ch: str) -> int:
    return 1 if ch < "\u0300" else get_character_cell_size(ch)


class Wrapped:
    """``source`` (a pane's prompt then its text, cleaned) as lines of at most ``width`` cells:
    ``lines`` holds (start, end) offsets into ``source``; words move whole to the next line
    when they fit on one, longer ones are cut. ``extend`` adds text appended to ``source``."""

    def __init__(self, width: int) -> None:
        self.width = max(2, width)
        self.source = ""
        self.lines: list[tuple[int, int]] = [(0, 0)]

    def reset(self, source: str) -> None:
        self.source = ""
        self.lines = [(0, 0)]
        self.extend(source)

    def extend(self, more: str) -> None:
        """Append ``more`` and wrap from the start of the (open) last line."""
        if not more:
            return
        start = self.lines.pop()[0]
        self.source += more
        self._wrap_from(start)

    def _wrap_from(self, i: int) -> None:
        src, width, out = self.source, self.width, self.lines
        n = len(src)
        line_start, col, brk = i, 0, -1  # brk: where the line may break (just after a space)
        while i < n:
            ch = src[i]
            if ch == "\n":
                out.append((line_start, i))
                i += 1
                line_start, col, brk = i, 0, -1
                continue
            w = _cells(ch)
            if col + w > width:
                if ch == " ":  # a space at the edge: the line ends here, the space with it
                    out.append((line_start, i))
                    i += 1
                    line_start, col = i, 0
                elif brk > line_start:  # the word moves whole to the next line
                    out.append((line_start, brk - 1))
                    line_start = brk
                    col = sum(_cells(c) for c in src[brk:i])
                else:  # a word longer than the line: cut
                    out.append((line_start, i))
                    line_start, col = i, 0
                brk = -1
                continue
            col += w
            if ch == " ":
                brk = i + 1
            i += 1
        out.append((line_start, n))  # the open last line


def tail_lines(wrapped: Wrapped, n: int) -> list[tuple[int, int]]:
    """The last ``n`` lines (what a pane of ``n`` text rows shows: the newest text)."""
    return wrapped.lines[-n:] if n > 0 else []
