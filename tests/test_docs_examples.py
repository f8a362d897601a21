"""The docs' examples run as written and print what the docs show: each ```python block on
docs/engine.md is executed, and where a ```text block follows it, the output must equal it; the
serving page's client examples run, in order, against a real server (its address put in)."""

import contextlib
import io
import re
import textwrap
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGE = DOCS / "engine.md"
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


def test_the_serving_pages_client_examples_run_against_a_server():
    from tests.helpers import serve_in_thread
    from tinyllm.model.checkpoint import load_checkpoint

    blocks = [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", (DOCS / "serving.md").read_text(), re.S)]
    assert len(blocks) >= 3 and all("127.0.0.1:8000" in b or "client." in b for b in blocks)
    server = serve_in_thread(*load_checkpoint(), slots=4)
    try:
        scope: dict = {"__name__": "__docs__"}
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            for i, block in enumerate(blocks):
                code = block.replace("http://127.0.0.1:8000", server.url)
                exec(compile(code, f"serving.md example {i + 1}", "exec"), scope)
        assert printed.getvalue().strip()  # every example printed something
    finally:
        server.stop()
