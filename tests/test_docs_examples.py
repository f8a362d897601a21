"""The docs' engine examples run as written and print what the docs show: each ```python block
on docs/engine.md is executed, and where a ```text block follows it, the output must equal it."""

import contextlib
import io
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parent.parent / "docs" / "engine.md"
BLOCK = re.compile(r"```python\n(.*?)```\n(?:\n```text\n(.*?)```)?", re.S)


def examples() -> list[tuple[str, str | None]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(PAGE.read_text())]


def test_the_page_has_examples_with_their_output():
    assert sum(out is not None for _, out in examples()) >= 2


@pytest.mark.parametrize("i", range(len(examples())))
def test_an_example_prints_what_the_page_shows(i):
    code, shown = examples()[i]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, f"{PAGE.name} example {i + 1}", "exec"), {"__name__": "__docs__"})
    if shown is not None:
        assert printed.getvalue() == shown
