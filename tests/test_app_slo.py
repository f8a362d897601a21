"""--slo in the app: the counters say how many ended requests met it and the goodput, each ended
request's row and pane carry its mark, and both say what the snapshot's verdicts say.

Uses test_app's helpers and its no-error guard (imported: every app a test makes is watched)."""

from __future__ import annotations

from tests.test_app import make_app, no_unexpected_errors, until  # noqa: F401
from tinyllm.slo import SLO, snapshot_summary, snapshot_verdicts
from tui.cli import build_parser, with_slo
from tui.widgets.kv_panel import KVPanel
from tui.widgets.request_list import RequestList
from tui.widgets.request_pane import RequestPane


def plain(app, widget) -> str:
    options = app.console.options.update_width(widget.size.width)
    return "".join(seg.text for seg in app.console.render(widget.render(), options))


async def test_the_counters_and_each_row_show_the_slo_verdicts(tmp_path):
    """Two one-token requests (no time per output token to miss) and two of five tokens against a
    TPOT target no step can meet: 2 met, 2 missed, whatever the machine's speed."""
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(f'{{"prompt": "ROMEO:", "max_new_tokens": {n}}}\n' for n in (1, 5, 1, 5)))
    app = with_slo(make_app(slots=4, prompts_file=wl), build_parser().parse_args(["--slo", "ttft=1000s,tpot=0.001ms"]))
    assert app.slo == SLO(ttft_s=1000.0, tpot_s=1e-6)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: len(app.runner.frame.snapshot.requests) == 4, what="the workload")
        while any(v.state not in ("finished", "aborted", "failed") for v in app.runner.frame.snapshot.requests):
            steps = app.runner.steps_done
            await pilot.press("n")  # step once (paused)
            # (the frame's count: the runner counts a step before it publishes the step's frame)
            await until(pilot, lambda: app.runner.frame.steps_done > steps, what="a step's frame")
        f = app.runner.frame
        verdicts = snapshot_verdicts(f.snapshot, f.tracks, app.slo)
        summary = snapshot_summary(f.snapshot, f.tracks, app.slo)
        assert sorted(v.outcome for v in verdicts.values()) == ["met", "met", "missed", "missed"]
        assert all(v.missed == ("tpot",) for v in verdicts.values() if not v.met)
        app.refresh_from_runner(force=True)
        await pilot.pause()
        counters = " ".join(plain(app, app.query_one(KVPanel)).split())
        assert (summary.met, summary.judged) == (2, 4)
        assert f"goodput {summary.goodput:.2f}/s 2/4 met" in counters
        rows = app.query_one(RequestList)
        for rid, v in verdicts.items():
            assert ("✓finished" if v.met else "✗finished") in rows.row_text(rid)
        missed = next(rid for rid, v in verdicts.items() if not v.met)
        rows.focus()
        await pilot.press("home")
        while rows.selected_rid() != missed:
            await pilot.press("down")
        await until(pilot, lambda: app.query_one(RequestPane).rid == missed, what="the pane")
        header = app.query_one("#pane-header").text.plain
        assert f"SLO {verdicts[missed].mark}" in header and "✗ tpot" in header
        assert not [n for n in app.notified if n[0] != "information"]  # no error or warning toasted
