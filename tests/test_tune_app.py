"""tinyllm-tui --tune: the search watched live, then the answer in the log."""

from __future__ import annotations

import asyncio
import json

import pytest

from tinyllm.args import OneLineParser
from tinyllm.tune.command import add_tune_args
from tinyllm.tune.session import prepare
from tui.cli import main as tui_main
from tui.tune_app import TuneApp


def session(tmp_path, *extra: str):
    lines = [{"prompt": "ROMEO:\n" * 2, "max_new_tokens": 24, "arrival_s": i * 0.002} for i in range(6)]
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps(x) + "\n" for x in lines))
    parser = OneLineParser()
    add_tune_args(parser)
    args = ["--slo", "tpot=2ms", "--kv-memory", "0.75", "--max-len", "64", "--no-confirm", *extra]
    return prepare(parser.parse_args([str(wl), *args, "--search", "max_num_seqs=1,2,4,64"]))


async def test_the_live_view_shows_points_as_they_finish_then_the_answer(tmp_path):
    app = TuneApp(session(tmp_path))
    async with app.run_test(size=(140, 50)) as pilot:
        for _ in range(600):
            if app.answer is not None:
                break
            await asyncio.sleep(0.05)
        await pilot.pause()
        assert app.answer is not None and len(app.outcomes) >= 4
        table = app.query_one("DataTable")
        assert table.row_count == 4  # the 4 configurations (64 is the defaults), on every request
        text = "\n".join(str(line.text) for line in app.query_one("RichLog").lines)
        assert "winner:" in text and "vllm serve MODEL" in text
        assert "finished" in str(app.query_one("#status").render())


def test_tinyllm_tui_tune_refuses_bad_input_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        tui_main(["--tune", "poisson_arrivals", "--slo", "ttft=1s", "--search", "max_seqs=4"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "unknown setting 'max_seqs'" in err and "\n" not in err
