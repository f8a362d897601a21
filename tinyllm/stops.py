"""Stop strings, matched on the detokenized text: the one matcher the server and the app share.

The engine works on token ids and never sees text, so a stop string is found by whoever
detokenizes a request's tokens (the server's handler, the app's runner): ``StopText`` turns
tokens into the text a client may see, holding back any tail that could still become the start
of a stop string, so a stream never emits text that a later token turns into a stop (vLLM's
rule). On a match the text ends just before the stop string, and the caller ends the request
in the engine (``ContinuousEngine.finish(rid, keep=stopper.tokens)``), freeing its slot and
blocks. Torch-free: the app's UI process imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Detokenizer(Protocol):
    """An incremental decoder (``Tokenizer.stream()``): the text each new token completes."""

    def step(self, token_id: int) -> str: ...


class StopMatcher:
    """Text in pieces → text safe to emit; finds the one of ``stops`` that completes first, across piece boundaries."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self.matched: str | None = None  # the stop string found (then nothing more is emitted)
        self._held = ""

    def feed(self, piece: str) -> str:
        """The text that can be emitted now that ``piece`` arrived."""
        if self.matched is not None:
            return ""
        text = self._held + piece
        hits = [(i + len(s), i, s) for s in self.stops if (i := text.find(s)) >= 0]
        if hits:  # the stop that completes first, as a stream sees it
            _, at, self.matched = min(hits)  # (so the answer never depends on where tokens split)
            self._held = ""
            return text[:at]
        keep = self._open_tail(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The request ended without a match: what was held back is plain text after all."""
        out, self._held = ("" if self.matched is not None else self._held), ""
        return out

    def _open_tail(self, text: str) -> int:
        """Length of the longest tail of ``text`` that is a proper prefix of some stop string."""
        for n in range(min(len(text), max((len(s) for s in self.stops), default=1) - 1), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0


class StopText:
    """One request's tokens → the text a client sees, with its stop strings applied. ``tokens``
    counts the tokens fed up to and including the one that completed a stop string (the tokens
    to keep in the engine); ``stopped`` once one matched. As in vLLM, stop strings are looked
    for only from the ``min_tokens``-th token on (text before it is never cut)."""

    def __init__(self, detok: Detokenizer, stops: Sequence[str] = (), min_tokens: int = 0):
        self.detok = detok
        self.matcher = StopMatcher(stops)
        self.min_tokens = min_tokens
        self.tokens = 0

    @property
    def stopped(self) -> bool:
        return self.matcher.matched is not None

    def step(self, token_id: int) -> str:
        """Text to emit after this token (nothing once stopped: later tokens are dropped)."""
        if self.stopped:
            return ""
        self.tokens += 1
        piece = self.detok.step(token_id)
        return piece if self.tokens < self.min_tokens else self.matcher.feed(piece)

    def flush(self) -> str:
        return self.matcher.flush()


def parse_stop_list(text: str) -> tuple[str, ...]:
    """The settings dialog's stop list: strings separated by ``|``, with ``\\n``, ``\\t``, ``\\|``
    and ``\\\\`` escapes (``\\n\\n|ROMEO:`` is two stops; spaces are part of a stop)."""
    out, cur, i = [], [], 0
    escapes = {"n": "\n", "t": "\t", "|": "|", "\\": "\\"}
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and text[i + 1] in escapes:
            cur.append(escapes[text[i + 1]])
            i += 2
            continue
        if c == "|":
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    out.append("".join(cur))
    return tuple(p for p in out if p)


def format_stop_list(stops: Sequence[str]) -> str:
    """``parse_stop_list``'s inverse: what the dialog shows for ``stops``."""

    def esc(s: str) -> str:
        return s.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "\\n").replace("\t", "\\t")

    return "|".join(esc(s) for s in stops)
