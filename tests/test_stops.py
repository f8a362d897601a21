"""The one stop-string matcher: matches across token boundaries, never emits text a later token
cuts, excludes the stop string, and gives back held text when the request ends otherwise."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from tinyllm.stops import StopMatcher, StopText, format_stop_list, parse_stop_list


class Pieces:
    """A detokenizer whose token i is the text pieces[i]."""

    def __init__(self, pieces: list[str]):
        self.pieces = pieces

    def step(self, token_id: int) -> str:
        return self.pieces[token_id]


def run(pieces: list[str], stops: list[str]) -> tuple[list[str], StopText]:
    st_ = StopText(Pieces(pieces), stops)
    out = [st_.step(i) for i in range(len(pieces))]
    if not st_.stopped:
        out.append(st_.flush())
    return out, st_


def test_a_stop_split_across_tokens_is_found_and_excluded():
    out, s = run(["Hel", "lo EN", "D and more", " text"], ["END"])
    assert "".join(out) == "Hello " and s.stopped and s.tokens == 3
    assert out == ["Hel", "lo ", "", ""]  # "EN" was held back, never emitted


def test_the_earliest_stop_wins_and_held_text_comes_back_without_a_match():
    out, _ = run(["ab", "cd", "ef"], ["def", "bc"])
    assert "".join(out) == "a"
    out, s = run(["xx", "EN"], ["END"])
    assert out == ["xx", "", "EN"] and not s.stopped  # flushed at the end


def test_nothing_after_a_stop_is_emitted_and_tokens_counts_to_the_stop():
    s = StopText(Pieces(["a\n", "\nb", "c"]), ["\n\n"])
    assert [s.step(0), s.step(1), s.step(2)] == ["a", "", ""] and s.tokens == 2 and s.flush() == ""


@given(
    text=st.text("abAB\n", max_size=40),
    stops=st.lists(st.text("abAB\n", min_size=1, max_size=4), max_size=3),
    seed=st.integers(0, 1000),
)
def test_any_split_emits_exactly_the_text_before_the_first_stop(text, stops, seed):
    """Property: however the text is cut into tokens, what is emitted is the text before the stop
    string that completes first (ties: the longer one), and nothing is taken back."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 8)))) if len(text) > 1 else []
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])] if text else []
    hits = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]  # the first to complete wins
    want = text[: min(hits)[1]] if hits else text
    out, _ = run(pieces, stops)
    assert "".join(out) == want


def test_matcher_alone_and_the_dialogs_stop_list_round_trips():
    m = StopMatcher(["", "xy"])
    assert m.stops == ("xy",) and m.feed("ax") == "a" and m.feed("z") == "xz"
    stops = ("\n\n", "ROMEO:", "a|b", "back\\slash", "\t")
    assert parse_stop_list(format_stop_list(stops)) == stops
    assert parse_stop_list("\\n\\n|ROMEO:") == ("\n\n", "ROMEO:") and parse_stop_list("") == ()


def test_stop_strings_are_looked_for_from_min_tokens_on():
    s = StopText(Pieces(["ab", "ab", "ab"]), ["ab"], min_tokens=2)
    assert [s.step(0), s.step(1), s.step(2)] == ["ab", "", ""] and s.tokens == 2  # the first "ab" is kept
