"""`tinyllm trace FILE` prints a table of the recording's requests (TTFT, end-to-end, tokens,
preemptions, how each ended, why it waited) besides its one-line summary and the Perfetto
export; and the app's slot grid shows an idle engine's slots free (issue 44, item 8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_app import make_app, no_unexpected_errors, submit, submit_and_step, until  # noqa: F401
from tests.test_recording import record_run
from tinyllm.cli import main
from tinyllm.observe.trace import WAIT_SHORT
from tinyllm.units import duration
from tui.widgets.slot_grid import SlotGrid

RECORDING = Path(__file__).parent / "data" / "preemption-run.jsonl"  # made before wait reasons were recorded


def table_rows(out: str) -> dict[int, list[str]]:
    """The table's rows by request id, split on runs of two or more spaces."""
    import re

    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#  prompt"))
    rows = {}
    for line in lines[start + 1 :]:
        if not line[:1].isdigit():
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[int(cells[0])] = cells
    return rows


@pytest.mark.parametrize("config", ["slots", "paged-tight", "chunked-tight-prefix"])
def test_trace_prints_each_requests_figures_as_the_engine_counted_them(tmp_path, capsys, config):
    path = tmp_path / "run.jsonl"
    eng, _ = record_run(path, config)
    assert main(["trace", str(path)]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    snap = eng.snapshot()
    assert sorted(rows) == [v.rid for v in snap.requests]
    for v in snap.requests:
        rid, prompt, tokens, ttft, e2e, preempted, ended, waited = rows[v.rid]
        assert (int(prompt), tokens) == (len(v.prompt), f"{len(v.tokens)}/{v.max_new_tokens}")
        assert (ttft, e2e) == (duration(v.ttft_s), duration(v.finish_s - v.arrival_s))
        assert preempted == (f"{v.preemptions}×" if v.preemptions else "0")
        assert ended.startswith(v.state) and (v.state != "finished" or ended == "finished (length)")
        counted = sorted(eng.waited(v.rid).items(), key=lambda kv: (-kv[1], kv[0]))
        assert waited == (", ".join(f"{WAIT_SHORT[code]} {n}" for code, n in counted) or "—")
    assert any("aborted at step 3" in r[6] for r in rows.values())  # (record_run aborts #3 at step 3)
    assert "waited: the steps it computed nothing" in out


def test_a_run_where_nothing_waited_says_so(tmp_path, capsys):
    """(Not "?": "—" is "never waited"; a recording with no waiting events at all read as old.)"""
    path = tmp_path / "run.jsonl"
    record_run(path, "slots", aborts=(), n=1)
    assert main(["trace", str(path)]) == 0
    out = capsys.readouterr().out
    assert table_rows(out)[0][-1] == "—" and "?" not in out


def test_a_recording_made_before_wait_reasons_says_it_has_none(capsys):
    assert main(["trace", str(RECORDING)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("112 steps · 6 requests · 4 preemptions · 1 aborts")
    rows = table_rows(out)
    assert len(rows) == 6 and all(r[-1] == "?" for r in rows.values())
    assert rows[5][6] == "aborted at step 30" and rows[2][5] == "2×"
    assert "? = this recording has no reasons" in out


async def test_an_idle_engines_slots_show_free_and_a_paused_step_keeps_its_news():
    app = make_app(new=3)
    async with app.run_test(size=(120, 36)) as pilot:
        v = await submit_and_step(pilot, "ROMEO:", 5)  # paused, by hand: the step that finished it says so
        assert v.state == "finished"
        grid = app.query_one(SlotGrid)
        assert "✓ done" in grid.render().plain
        await pilot.press("escape", "space")  # running, with nothing to run: idle
        await until(pilot, lambda: not app.runner.frame.paused, what="the engine to run")
        await until(pilot, lambda: "✓ done" not in grid.render().plain, what="the slot to show free")
        assert grid.render().plain.count("free") == app.runner.frame.snapshot.n_slots
        idle_step = app.runner.frame.snapshot.counters.steps
        await pilot.press("space")  # paused at the same step: the screen stays as it was
        await until(pilot, lambda: app.runner.frame.paused, what="the pause")
        assert app.runner.frame.snapshot.counters.steps == idle_step
        assert "✓ done" not in grid.render().plain
        assert grid.render().plain.count("free") == app.runner.frame.snapshot.n_slots
        await submit(pilot, "JULIET:")  # queued at the same step, paused: still no old news
        await until(pilot, lambda: len(app.runner.frame.snapshot.requests) == 2, what="the queued prompt")
        assert app.runner.frame.snapshot.counters.steps == idle_step and "✓ done" not in grid.render().plain
