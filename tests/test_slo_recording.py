"""SLOs in a recording and its Perfetto export: the run's SLO in the header, a request's own SLO
when it is submitted, each request's verdict when it ends; recordings made before them still
read, as runs without an SLO (no textual here)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import run_to_the_end
from tests.test_app import bundled
from tests.test_app_replay import RECORDING
from tinyllm.engine import ContinuousEngine, Sampling
from tinyllm.observe.recording import RecordingError, header_slo, read_recording, recorded_slos, recorded_verdicts
from tinyllm.observe.trace import perfetto_trace, request_rows, request_table, slo_line
from tinyllm.request import RequestSettings
from tinyllm.slo import SLO, snapshot_verdicts
from tui.cli import build_app
from tui.runners.engine import EngineRunner
from tui.runners.frames import FrameBuilder, FrameRecorder

RUN_SLO = SLO(ttft_s=100.0)  # every request that finishes meets it, whatever the machine
NO_PACE = SLO(tpot_s=1e-6)  # no decode step takes a microsecond: a request of 5 tokens misses it


def recorded_run(path):
    """Three requests against the run's SLO: #0 by it (met), #1 by its own impossible TPOT
    target (missed), #2 aborted. Returns the live runner's last frame."""
    model, tok = bundled()
    eng = ContinuousEngine(model, 3, 128, generator=torch.Generator().manual_seed(0))
    rec = FrameRecorder(path, eng.snapshot(), "bundled", "nowhere", {}, slo=RUN_SLO)
    r = EngineRunner(eng, tok, paused=True, recorder=rec)
    settings = RequestSettings(Sampling(), 5, True)
    r._submit("ROMEO:", None, settings)
    r._submit("JULIET:", None, settings, slo=NO_PACE)
    r._submit("HAMLET:", None, RequestSettings(Sampling(), 40, True))
    return run_to_the_end(r, aborts={2: 2})


def test_a_recording_round_trips_the_slo_and_each_outcome(tmp_path):
    path = tmp_path / "run.jsonl"
    live = recorded_run(path)
    assert live.slos == {1: NO_PACE}
    header, records, warning = read_recording(path)
    recs = [rec for _, rec in records]
    assert warning is None and header_slo(header) == RUN_SLO
    assert recorded_slos(recs) == {1: NO_PACE}
    got = recorded_verdicts(recs)
    want = snapshot_verdicts(live.snapshot, live.tracks, RUN_SLO, live.slos)
    assert {rid: v for rid, (v, _) in got.items()} == want  # what the live app showed, reasons too
    assert {rid: (v.outcome, str(slo)) for rid, (v, slo) in got.items()} == {
        0: ("met", "ttft=100000ms"),
        1: ("missed", "tpot=0.001ms"),
        2: ("aborted", "ttft=100000ms"),
    }
    assert got[1][0].missed == ("tpot",)
    b = FrameBuilder(header)  # a replay knows each request's own SLO, as the live app did
    for rec in recs:
        b.apply(rec)
    assert b.frame(0, True, 0).slos == live.slos
    assert slo_line(header, recs) == "SLO ttft=100000ms: 1/2 met (50%), 1 aborted"
    table = request_table(request_rows(header, recs))
    assert "SLO" in table.splitlines()[0] and "✗ tpot" in table and "✓" in table


def test_the_perfetto_export_carries_each_verdict_and_marks_a_miss(tmp_path):
    path = tmp_path / "run.jsonl"
    recorded_run(path)
    header, records, _ = read_recording(path)
    trace = perfetto_trace(header, [rec for _, rec in records])
    evs = trace["traceEvents"]
    spans = {rid: [e for e in evs if e["ph"] == "X" and e["pid"] == 1 and e["tid"] == rid + 1] for rid in range(3)}
    for rid, outcome in ((0, "met"), (1, "missed"), (2, "aborted")):
        assert spans[rid] and all(e["args"]["slo_outcome"] == outcome for e in spans[rid]), rid
    assert spans[1][0]["args"]["slo"] == "tpot=0.001ms" and spans[1][0]["args"]["slo_missed"] == "tpot"
    missed = [e for e in evs if e["ph"] == "i" and e["name"].startswith("SLO missed")]
    assert len(missed) == 1 and missed[0]["tid"] == 2 and missed[0]["name"].startswith("SLO missed: tpot")
    assert missed[0]["ts"] == spans[1][-1]["ts"] + spans[1][-1]["dur"]  # when it ended
    assert trace["otherData"]["slo"] == "ttft=100000ms"
    json.dumps(trace)  # (what tinyllm trace --perfetto writes)


def test_a_recording_made_before_slos_reads_as_a_run_without_one():
    header, records, warning = read_recording(RECORDING)
    recs = [rec for _, rec in records]
    assert warning is None and header_slo(header) is None
    assert recorded_slos(recs) == {} and recorded_verdicts(recs) == {} and slo_line(header, recs) == ""
    evs = perfetto_trace(header, recs)["traceEvents"]
    assert not any("slo" in e.get("args", {}) or e["name"].startswith("SLO") for e in evs)
    assert "SLO" not in request_table(request_rows(header, recs)).splitlines()[0]
    assert build_app(["--replay", str(RECORDING)]).slo is None


def test_a_replay_without_slo_judges_by_the_recorded_one(tmp_path):
    path = tmp_path / "run.jsonl"
    recorded_run(path)
    assert build_app(["--replay", str(path)]).slo == RUN_SLO
    assert build_app(["--replay", str(path), "--slo", "tpot=50ms"]).slo == SLO(tpot_s=0.05)  # --slo wins


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"verdict": {"0": {"outcome": "great"}}}, ":3: a bad SLO or verdict (an SLO verdict must be"),
        ({"verdict": {"0": {"outcome": "met", "slo": "ttft=5"}}}, ":3: a bad SLO or verdict (SLO ttft=5: give a unit"),
        ({"slo": {"0": "fast"}}, ":3: a bad SLO or verdict (SLO part 'fast'"),
    ],
)
def test_a_bad_verdict_or_slo_is_refused_with_its_line(tmp_path, bad, message):
    lines = RECORDING.read_text().splitlines()
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([lines[0], lines[1], json.dumps({"step": 0, **bad}), *lines[2:]]) + "\n")
    with pytest.raises(RecordingError, match=None) as e:
        read_recording(path)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_bad_slo_in_the_header_is_refused(tmp_path):
    lines = RECORDING.read_text().splitlines()
    header = json.loads(lines[0]) | {"slo": "ttft=-1ms"}
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    with pytest.raises(
        RecordingError, match=r':1: the header\'s "slo" is not an SLO \(SLO ttft=-1ms: expected a time > 0\)'
    ):
        read_recording(path)


def test_requests_own_slos_cross_the_engine_process_pipe(tmp_path):
    """The child process sends each request's own SLO once; the app's frames keep them all."""
    from tui.runners.frames import FrameDiffer, FrameMerger

    live = recorded_run(tmp_path / "run.jsonl")
    differ, merger = FrameDiffer(), FrameMerger()
    first = differ.delta(live)
    assert first.slos == {1: NO_PACE}
    assert merger.merge(first).slos == {1: NO_PACE}
    again = differ.delta(live)
    assert again.slos == {} and merger.merge(again).slos == {1: NO_PACE}


def test_whatif_on_a_recording_judges_by_its_recorded_slos(tmp_path):
    """tinyllm whatif FILE (and the race on it): the recorded run's SLO where --slo is not given,
    each request's own as recorded; a recording made before SLOs: none."""
    from tinyllm.race.whatif import load_judging

    path = tmp_path / "run.jsonl"
    recorded_run(path)
    j = load_judging(str(path), None)
    assert (j.slo, j.own, j.ended) == (RUN_SLO, (None, NO_PACE, None), ("finished", "finished", "aborted"))
    assert load_judging(str(path), SLO(tpot_s=0.05)).slo == SLO(tpot_s=0.05)
    old = load_judging(str(RECORDING), None)
    assert old.slo is None and not old.active
