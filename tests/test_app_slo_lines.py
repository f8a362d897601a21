"""A prompt file whose lines carry their own "slo": the app judges each request by its line's SLO
(--slo only where a line has none), records each verdict, and its replay shows the same marks.

Uses test_app's helpers and its no-error guard (imported: every app a test makes is watched)."""

from __future__ import annotations

import torch

from tests.test_app import _watch, bundled, no_unexpected_errors, until, watched_app  # noqa: F401
from tests.test_app_slo import plain
from tinyllm.engine import ContinuousEngine
from tinyllm.observe.recording import header_slo, read_recording, recorded_verdicts
from tinyllm.slo import SLO, snapshot_verdicts
from tui.app import TinyLLMApp
from tui.cli import build_app, build_parser, with_slo
from tui.runners.frames import FrameRecorder
from tui.widgets.kv_panel import KVPanel
from tui.widgets.request_list import RequestList
from tui.widgets.request_pane import RequestPane

# --slo asks for a pace no step keeps; line 0's own SLO asks only for a first token within 100 s
# (met), line 1's for one within a microsecond (missed: ttft, not the run's tpot).
RUN_SLO = "tpot=0.001ms"
LINES = (
    '{"prompt": "ROMEO:", "max_new_tokens": 5, "slo": "ttft=100s"}\n'
    '{"prompt": "JULIET:", "max_new_tokens": 5, "slo": {"ttft": "0.001ms"}}\n'
)
OWN = {0: SLO(ttft_s=100.0), 1: SLO(ttft_s=1e-6)}
MARKS = {0: ("✓finished", "SLO ✓"), 1: ("✗finished", "SLO ✗ ttft")}


def recording_app(wl, path) -> TinyLLMApp:
    model, tok = bundled()
    eng = ContinuousEngine(model, 2, 128, generator=torch.Generator().manual_seed(0))
    rec = FrameRecorder(path, eng.snapshot(), "shakespeare", "nowhere", {}, slo=SLO.parse(RUN_SLO))
    app = watched_app(eng, tok, 5, recorder=rec, prompts_file=wl)
    return with_slo(app, build_parser().parse_args(["--slo", RUN_SLO]))


async def shows_each_requests_own_verdict(pilot, app) -> str:
    """Each row's mark and each pane's verdict are its own line's; returns the counters' text."""
    rows = app.query_one(RequestList)
    rows.focus()
    for rid, (row, pane) in MARKS.items():
        assert row in rows.row_text(rid), rid
        await pilot.press("home", *["down"] * rid)
        await until(pilot, lambda: app.query_one(RequestPane).rid == rid, what=f"#{rid}'s pane")
        assert pane in app.query_one("#pane-header").text.plain, rid
    counters = " ".join(plain(app, app.query_one(KVPanel)).split())
    assert "1/2 met" in counters
    assert not [n for n in app.notified if n[0] != "information"]  # no error or warning toasted
    return counters


async def test_each_workload_line_is_judged_by_its_own_slo_live_and_in_the_replay(tmp_path):
    wl, path = tmp_path / "w.jsonl", tmp_path / "run.jsonl"
    wl.write_text(LINES)
    app = recording_app(wl, path)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: len(app.runner.frame.snapshot.requests) == 2, what="the workload")
        while any(v.state != "finished" for v in app.runner.frame.snapshot.requests):
            steps = app.runner.steps_done
            await pilot.press("n")  # step once (paused)
            # (the frame's count: the runner counts a step before it publishes the step's frame)
            await until(pilot, lambda: app.runner.frame.steps_done > steps, what="a step's frame")
        f = app.runner.frame
        assert f.slos == OWN
        verdicts = snapshot_verdicts(f.snapshot, f.tracks, app.slo, f.slos)
        assert {rid: (v.outcome, v.missed) for rid, v in verdicts.items()} == {0: ("met", ()), 1: ("missed", ("ttft",))}
        live_counters = await shows_each_requests_own_verdict(pilot, app)
        await pilot.press("q")
    assert app.runner.returned.wait(5)

    header, records, _ = read_recording(path)
    assert header_slo(header) == SLO.parse(RUN_SLO)
    assert {rid: v for rid, (v, _) in recorded_verdicts([r for _, r in records]).items()} == verdicts

    replay = build_app(["--replay", str(path)])  # no --slo: the recording's, and each line's own
    _watch(replay)
    assert replay.slo == SLO.parse(RUN_SLO)
    async with replay.run_test(size=(160, 48)) as pilot:
        await pilot.press(">")  # to the recording's last step
        end = replay.runner.last_step
        await until(pilot, lambda: replay.runner.frame.snapshot.counters.steps == end, what="the last step")
        assert replay.runner.frame.slos == OWN
        assert await shows_each_requests_own_verdict(pilot, replay) == live_counters
