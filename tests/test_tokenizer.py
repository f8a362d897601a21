"""Streaming decode equals decoding all at once, multi-byte characters included."""

from __future__ import annotations

import pytest

from tinyllm.model.checkpoint import load_checkpoint

TEXTS = [
    "ROMEO: But, soft! what light through yonder window breaks?",
    "naïve café — “quotes” ½ and 世界 and 🎭🗡️ emoji",
    "tabs\tand\nnewlines\n\n  indented [markup] \\escaped",
]


@pytest.fixture(scope="module")
def tok():
    return load_checkpoint()[1]


@pytest.mark.parametrize("text", TEXTS)
def test_stream_concatenation_equals_full_decode(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    stream = tok.stream()
    pieces = [stream.step(i) for i in ids]
    assert "".join(pieces) == text


def test_multibyte_characters_are_held_back_until_complete(tok):
    ids = tok.encode("🎭")
    assert len(ids) > 1  # one emoji is several byte-level tokens
    stream = tok.stream()
    pieces = [stream.step(i) for i in ids]
    assert pieces[:-1] == [""] * (len(ids) - 1) and pieces[-1] == "🎭"


def test_eos_is_the_end_of_text_token(tok):
    assert tok.eos_id is not None
    assert tok.hf.id_to_token(tok.eos_id) == "<|endoftext|>"
    stream = tok.stream(skip_special_tokens=True)
    assert stream.step(tok.eos_id) == ""
