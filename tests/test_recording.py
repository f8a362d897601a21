"""Recording, replay, the request timeline and the Perfetto export (no textual here).

The core check: a replay rebuilds, at every step, exactly the frame the live runner published
(snapshot, texts, prompts, event log, timeline tracks), through preemptions, aborts, chunked
prefill and prefix-cache hits, and through a real JSON file."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from tests.test_app import bundled
from tinyllm.engine import ContinuousEngine, Sampling
from tinyllm.observe.recording import FORMAT, VERSION, RecordingError, read_recording
from tinyllm.observe.snapshot import LifecycleEvent
from tinyllm.observe.timeline import build_tracks
from tinyllm.observe.trace import perfetto_trace
from tinyllm.request import RequestSettings
from tui.runners.engine import EngineRunner
from tui.runners.frames import FrameBuilder, FrameRecorder
from tui.runners.interface import TOGGLE_PAUSED, Abort, JumpEvent, SeekStep, StepBack, StepOnce
from tui.runners.replay import ReplayRunner

COMPARED = ("snapshot", "texts", "prompts", "log", "tracks", "steps_done")

CONFIGS = {  # kv, chunked prefill, KV blocks (tight: preemptions), prefix cache
    "slots": dict(kv="slots"),
    "paged-tight": dict(kv="paged", block_size=8, kv_blocks=10),
    "chunked-tight-prefix": dict(kv="paged", block_size=8, kv_blocks=12, chunked_prefill=True, max_batched_tokens=16),
    "chunked-speculation": dict(  # drafts kept and rolled back: their counters replay too
        kv="paged", block_size=8, kv_blocks=12, chunked_prefill=True, max_batched_tokens=32, num_speculative_tokens=3
    ),
}


def record_run(path, config: str, aborts=(3,), n: int = 6, new: int = 24, forget_at: int | None = None):
    """Drive a runner step by step (as the app does when paused) with a recorder; return the
    live frames by step. Prompts share a prefix (cache hits) and grow (chunks); some abort."""
    model, tok = bundled()
    eng = ContinuousEngine(model, 3, 128, generator=torch.Generator().manual_seed(0), **CONFIGS[config])
    rec = FrameRecorder(path, eng.snapshot(), "bundled", "nowhere", {"config": config})
    r = EngineRunner(eng, tok, paused=True, recorder=rec)
    for i in range(n):
        r._submit(
            f"ROMEO: speak {i}. " * (i + 1),
            None,
            RequestSettings(Sampling(temperature=0.7 if i % 2 else 0.0), new, True),
        )
    frames = {}
    while eng.has_work():
        r._apply(StepOnce())
        r._publish()
        step = eng.steps
        if step in aborts:
            r._apply(Abort(step))  # abort request #step (queued, prefilling or decoding)
            r._apply(StepOnce())
            r._publish()
        if forget_at is not None and eng.steps >= forget_at and eng.forget_ended(1):
            r._note_changes()  # as a server does: old ended requests leave snapshots
            r._publish()
        frames[eng.steps] = r.frame
    r.stop()
    r.run()  # returns at once (stopped), closes the file
    return eng, frames


@pytest.mark.parametrize("config", CONFIGS)
def test_replay_rebuilds_every_frame_exactly(tmp_path, config):
    path = tmp_path / "run.jsonl"
    eng, frames = record_run(path, config)
    if config != "slots":
        assert eng.snapshot().counters.preemptions > 0, "the tight pool should have preempted"
    header, records, warning = read_recording(path)
    assert warning is None and header["format"] == FORMAT and header["version"] == VERSION
    b, rebuilt = FrameBuilder(header), {}
    for _, rec in records:
        b.apply(rec)
        rebuilt[rec["step"]] = b.frame(0, True, 0)
    assert set(frames) <= set(rebuilt)
    for step, live in frames.items():
        for name in COMPARED:
            assert getattr(rebuilt[step], name) == getattr(live, name), f"step {step}: {name} differs"
    aborted = [r for r in frames[max(frames)].snapshot.requests if r.state == "aborted"]
    assert aborted, "the run should contain an abort"


def test_requests_the_engine_forgets_leave_the_replay_too(tmp_path):
    """A server forgets old ended requests (forget_ended): the recording says so, and the
    rebuilt frames drop them (and their texts) at the same step as the live ones."""
    path = tmp_path / "run.jsonl"
    eng, frames = record_run(path, "chunked-tight-prefix", forget_at=20, n=8)
    assert len(frames[max(frames)].snapshot.requests) < 8, "forget_ended should have dropped ended requests"
    header, records, _ = read_recording(path)
    b, rebuilt = FrameBuilder(header), {}
    for _, rec in records:
        b.apply(rec)
        rebuilt[rec["step"]] = b.frame(0, True, 0)
    for step, live in frames.items():
        assert rebuilt[step].snapshot == live.snapshot, f"step {step}"
        assert set(rebuilt[step].texts) == {v.rid for v in live.snapshot.requests}, f"step {step}"


def test_forget_ended_keeps_the_newest_and_every_live_request():
    model, _ = bundled()
    eng = ContinuousEngine(model, 2, 64, generator=torch.Generator().manual_seed(0))
    from tinyllm.engine import Request

    rids = [eng.add_request(Request([1, 2, 3], 2 if i < 4 else 30)) for i in range(6)]
    while sum(v.state == "finished" for v in eng.snapshot().requests) < 4:
        eng.step()
    assert eng.forget_ended(keep=1) == 3
    left = [v.rid for v in eng.snapshot().requests]
    assert left == [3, 4, 5] and all(r not in eng.results for r in rids[:3])
    assert eng.add_request(Request([1], 1)) == 6  # ids keep growing, never reused
    while eng.has_work():
        eng.step()
    assert eng.forget_ended(keep=0) == 4 and eng.snapshot().requests == ()


def test_recording_is_small_and_gzip_works(tmp_path):
    plain, packed = tmp_path / "run.jsonl", tmp_path / "run.jsonl.gz"
    _, frames = record_run(plain, "chunked-tight-prefix", n=8, new=40)
    record_run(packed, "chunked-tight-prefix", n=8, new=40)
    steps = max(frames)
    per_step = plain.stat().st_size / steps
    assert per_step < 600, f"{per_step:.0f} bytes per step: 10,000 steps would not stay a few MB"
    assert packed.stat().st_size < plain.stat().st_size / 4
    with gzip.open(packed, "rt") as f:
        assert json.loads(f.readline())["format"] == FORMAT
    h1, r1, _ = read_recording(plain)
    h2, r2, _ = read_recording(packed)
    assert [r["step"] for _, r in r1] == [r["step"] for _, r in r2]


def _header_line() -> str:
    return json.dumps(
        {
            "format": FORMAT,
            "version": VERSION,
            "engine": {
                "n_slots": 1,
                "max_len": 8,
                "max_batched_tokens": None,
                "kv": {
                    "kind": "slots",
                    "reserved_tokens": 8,
                    "bytes_per_token": 1,
                    "block_size": None,
                    "n_blocks": None,
                },
            },
        }
    )


@pytest.mark.parametrize(
    "content, message",
    [
        ("", ":1: empty file"),
        ("hello\n", ":1: not a tinyllm recording"),
        ('{"format": "tinyllm-recording", "version": 99, "engine": {}}\n', "format version 99, newer than this"),
        (_header_line() + '\n{"step": 1}\n{"step": oops}\n{"step": 2}\n', ":3: broken record"),
        (_header_line() + '\n["not", "a", "record"]\n', ':2: a record must be a JSON object with an integer "step"'),
    ],
)
def test_bad_recordings_are_refused_with_file_and_line(tmp_path, content, message):
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    with pytest.raises(RecordingError, match=message.replace("(", r"\(")) as e:
        ReplayRunner(p)
    assert str(e.value).startswith(str(p))


@pytest.mark.parametrize(
    "record, message",
    [
        ('{"step": 1, "snap": {"s": {"0": {"zz": 1}}}}', ":2: a broken record (KeyError"),
        ('{"step": 1, "snap": {"c": [1, 2]}}', ":2: a broken record (ValueError: counters"),
        ('{"step": 5}\n{"step": 3}', ":3: step 3 comes after step 5"),
    ],
)
def test_records_that_do_not_apply_are_refused_with_their_line(tmp_path, record, message):
    p = tmp_path / "bad.jsonl"
    p.write_text(_header_line() + "\n" + record + "\n")
    with pytest.raises(RecordingError, match=message.replace("(", r"\(")):
        ReplayRunner(p)


def test_a_recording_cut_off_mid_line_replays_what_came_before(tmp_path):
    path = tmp_path / "run.jsonl"
    _, frames = record_run(path, "paged-tight")
    text = path.read_text()
    path.write_text(text[: len(text) - 25])  # killed while writing the last record
    r = ReplayRunner(path)
    assert r.warning and "cut off" in r.warning and f"{path}:" in r.warning
    assert 0 < r.last_step <= max(frames)


def test_replay_steps_back_and_forth_across_a_preemption_and_jumps(tmp_path):
    path = tmp_path / "run.jsonl"
    eng, frames = record_run(path, "paged-tight", aborts=())
    r = ReplayRunner(path, paused=True)
    pre = next(ev for ev in build_tracks(_events(path)) if ev.preempt_steps)
    p = pre.preempt_steps[0]
    r.apply(SeekStep(p - 1))
    before = r.frame
    assert before.snapshot.counters.steps == p - 1 and before.snapshot == frames[p - 1].snapshot
    r.apply(StepOnce())
    assert r.frame.snapshot == frames[p].snapshot
    assert r.frame.snapshot.request(pre.rid).state == "preempted"
    r.apply(StepBack())  # back across it
    assert r.frame.snapshot == before.snapshot and r.frame.texts == before.texts
    r.apply(SeekStep(r.last_step))
    for s in range(r.last_step, 0, -1):  # all the way back, one step at a time
        assert r.frame.snapshot == frames[s].snapshot, f"step {s}"
        r.apply(StepBack())
    # ] and [ land on the request's lifecycle moments, in order, and stop at the ends
    moments = sorted({s for s, _ in r.events_of(pre.rid)})
    r.apply(SeekStep(0))
    seen = []
    for _ in range(len(moments) + 2):
        r.apply(JumpEvent(pre.rid, +1))
        seen.append(r.step)
        jumped = r.frame
        r.apply(SeekStep(r.step))  # g to the same step shows the same (] showed a record mid-step)
        assert r.frame.snapshot == jumped.snapshot and r.frame.texts == jumped.texts
    assert seen[: len(moments)] == moments and seen[-1] == moments[-1]
    r.apply(JumpEvent(pre.rid, -1))
    assert r.step == moments[-2]
    assert any(k == "preempted" for _, k in r.events_of(pre.rid))


def test_replay_plays_to_the_end_and_stops(tmp_path):
    path = tmp_path / "run.jsonl"
    record_run(path, "slots", aborts=())
    r = ReplayRunner(path, paused=True, step_delay_ms=0)
    r.apply(TOGGLE_PAUSED)
    import threading

    t = threading.Thread(target=r.run, daemon=True)
    t.start()
    t.join(timeout=0.1)
    deadline = __import__("time").monotonic() + 30
    while not r.at_end and __import__("time").monotonic() < deadline:
        t.join(timeout=0.05)
    r.stop()
    t.join(timeout=5)
    assert r.at_end and r.paused and r.frame.snapshot.counters.steps == r.last_step


def test_a_jump_shows_its_step_as_g_does_when_a_prompt_came_in_that_step(tmp_path):
    """A prompt submitted after a step is recorded at that step, after the step's own record: ]
    to #0's end showed the step without it (queue 0), g to the same step with it (queue 1)."""
    model, tok = bundled()
    eng = ContinuousEngine(model, 2, 128, generator=torch.Generator().manual_seed(0), **CONFIGS["slots"])
    path = tmp_path / "run.jsonl"
    r = EngineRunner(eng, tok, paused=True, recorder=FrameRecorder(path, eng.snapshot(), "bundled", "nowhere", {}))
    for prompt in ("ROMEO:", "JULIET:"):  # the second sent once the first has ended, in its last step
        r._submit(prompt, None, RequestSettings(Sampling(temperature=0.0), 4, True))
        r._publish()
        while eng.has_work():
            r._apply(StepOnce())
            r._publish()
    r.stop()
    r.run()
    replay = ReplayRunner(path, paused=True)
    end = max(s for s, k in replay.events_of(0) if k == "finished")
    replay.apply(JumpEvent(0, +1))
    while replay.step < end:
        replay.apply(JumpEvent(0, +1))
    jumped = replay.frame
    replay.apply(SeekStep(end))
    assert jumped.snapshot == replay.frame.snapshot and len(jumped.snapshot.requests) == 2


def test_a_step_back_or_on_while_playing_pauses_there(tmp_path):
    """`b` while a replay played did nothing: it stepped back and the next tick stepped on again.
    A frame step pauses, as a video player's does."""
    path = tmp_path / "run.jsonl"
    record_run(path, "slots", aborts=())
    r = ReplayRunner(path, paused=False, step_delay_ms=0)
    for cmd, step in ((StepBack(), 9), (StepOnce(), 11)):
        r.apply(SeekStep(10))
        if r.paused:
            r.apply(TOGGLE_PAUSED)  # playing again
        assert not r.paused
        r.apply(cmd)
        assert r.paused and r.step == step and r.frame.snapshot.counters.steps == step


def _events(path) -> list[LifecycleEvent]:
    from tinyllm.observe.recording import decode_event

    _, records, _ = read_recording(path)
    return [decode_event(row) for _, rec in records for row in rec.get("life", ())]


# -- the timeline's tracks -----------------------------------------------------------------------
def ev(kind, rid, step, t=None, slot=None, tokens=0, reason="", cached=0):
    return LifecycleEvent(kind, rid, step, float(step if t is None else t), slot, tokens, reason, cached)


def test_tracks_follow_a_chunked_life_with_a_preemption():
    (t,) = build_tracks(
        [
            ev("queued", 0, 0),
            ev("admitted", 0, 2, slot=1, cached=16),
            ev("prefill", 0, 2, reason="16..32 of 40"),
            ev("prefill", 0, 3, reason="32..40 of 40"),
            ev("first_token", 0, 3),
            ev("preempted", 0, 6, slot=1),
            ev("admitted", 0, 9, slot=0),
            ev("prefill", 0, 9, reason="0..43 of 43"),
            ev("finished", 0, 12, slot=0, reason="eos"),
        ]
    )
    phases = [(s.phase, s.start_step, s.end_step) for s in t.spans]
    assert phases == [
        ("queued", 0, 1),
        ("prefill", 2, 3),
        ("decode", 4, 5),
        ("preempted", 6, 8),
        ("prefill", 9, 9),
        ("decode", 10, 12),
    ]
    assert t.end == "finished" and t.end_step == 12 and t.slot is None
    assert t.admissions == ((2, 16), (9, 0)) and t.chunk_steps == (2, 3, 9) and t.preempt_steps == (6,)
    assert [t.phase_at(s, 12) for s in (0, 2, 4, 7, 9, 11, 13)] == [
        "queued",
        "prefill",
        "decode",
        "preempted",
        "prefill",
        "decode",
        None,
    ]


def test_tracks_of_an_abort_while_queued_and_a_one_token_request():
    a, b = build_tracks(
        [
            ev("queued", 0, 0),
            ev("queued", 1, 0),
            ev("aborted", 0, 1),
            ev("admitted", 1, 1, slot=0),
            ev("prefill", 1, 1, reason="0..5 of 5"),
            ev("finished", 1, 1, slot=0, reason="length"),
        ]
    )
    assert [(s.phase, s.start_step, s.end_step) for s in a.spans] == [("queued", 0, 1)] and a.end == "aborted"
    assert [(s.phase, s.start_step, s.end_step) for s in b.spans] == [("queued", 0, 0), ("prefill", 1, 1)]
    assert b.end == "finished" and b.end_step == 1


def test_timeline_cells_zoom_keeps_the_most_telling_state():
    from tui.widgets.timeline import DECODE, ENDS, PREEMPT, paint

    (t,) = build_tracks(
        [
            ev("queued", 0, 0),
            ev("admitted", 0, 1, slot=0),
            ev("prefill", 0, 1, reason="0..4 of 4"),
            ev("preempted", 0, 5, slot=0),
            ev("admitted", 0, 7, slot=0),
            ev("prefill", 0, 7, reason="0..9 of 9"),
            ev("finished", 0, 9, slot=0),
        ]
    )
    one = "".join(c[0] if c else " " for c in paint(t, 0, 11, 1, 11))
    assert one == "░▓━━━P┄▓━✓  "
    four = paint(t, 0, 11, 4, 11)  # steps 0-3, 4-7, 8-11
    assert [c[0] for c in four] == ["▓", PREEMPT[0], ENDS["finished"][0]]
    assert paint(t, 2, 3, 1, 11) == [DECODE, DECODE]


# -- Perfetto ------------------------------------------------------------------------------------
def test_perfetto_export_follows_the_trace_event_format(tmp_path):
    path = tmp_path / "run.jsonl"
    eng, frames = record_run(path, "chunked-tight-prefix")
    header, records, _ = read_recording(path)
    trace = json.loads(json.dumps(perfetto_trace(header, [r for _, r in records])))  # plain JSON
    assert trace["displayTimeUnit"] == "ms"
    evs = trace["traceEvents"]
    assert {e["ph"] for e in evs} == {"M", "X", "C", "i"}
    for e in evs:
        assert isinstance(e["pid"], int) and isinstance(e["name"], str) and e["name"]
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index", "thread_sort_index")
            assert set(e["args"]) <= {"name", "sort_index"}
        else:
            assert isinstance(e["ts"], int) and e["ts"] >= 0  # whole microseconds
        if e["ph"] == "X":
            assert isinstance(e["dur"], int) and e["dur"] >= 0 and isinstance(e["tid"], int)
        if e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values())
        if e["ph"] == "i":
            assert e["s"] in ("t", "p", "g")
    # every track with spans is named, and its complete events never overlap
    named = {(e["pid"], e["tid"]) for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    by_track: dict = {}
    for e in evs:
        if e["ph"] == "X":
            by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    assert set(by_track) <= named
    for track, spans in by_track.items():
        spans.sort(key=lambda e: e["ts"])
        for a, b in zip(spans, spans[1:]):
            assert a["ts"] + a["dur"] <= b["ts"], f"overlap on {track}: {a} / {b}"
    # one request track per request, one instant per preemption and abort, slot tracks used
    snap = eng.snapshot()
    assert len([1 for p, _ in named if p == 1]) == len(snap.requests)
    assert sum(1 for e in evs if e["ph"] == "i" and e["name"] == "preempted") == snap.counters.preemptions
    assert sum(1 for e in evs if e["ph"] == "i" and e["name"] == "aborted") == snap.counters.aborted
    assert any(pid == 2 for pid, _ in by_track)
    phases = {e["name"] for e in evs if e["ph"] == "X" and e["pid"] == 1}
    assert {"queued", "prefill", "decode", "preempted"} <= phases


def test_trace_command_writes_perfetto_json_and_refuses_a_bad_file(tmp_path, capsys):
    from tinyllm.cli import main

    path, out = tmp_path / "run.jsonl", tmp_path / "out.json"
    record_run(path, "paged-tight")
    assert main(["trace", str(path), "--perfetto", str(out)]) == 0
    assert "preemptions" in capsys.readouterr().out
    assert json.loads(out.read_text())["traceEvents"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("nope\n")
    assert main(["trace", str(bad)]) == 2
    assert f"{bad}:1: not a tinyllm recording" in capsys.readouterr().err


def test_trace_and_whatif_never_write_over_the_recording_they_read_and_compress_a_gz(tmp_path, capsys):
    """`tinyllm trace run.jsonl --perfetto run.jsonl` printed "wrote run.jsonl" over the recording
    (and whatif's --json did the same); a --perfetto file named .gz held plain JSON."""
    import gzip

    from tinyllm.cli import main

    path = tmp_path / "run.jsonl"
    record_run(path, "paged-tight")
    before = path.read_bytes()
    for argv in (
        ["trace", str(path), "--perfetto", str(path)],
        ["whatif", str(path), "--lanes", "fcfs", "priority", "--json", str(tmp_path / "." / "run.jsonl")],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"is the file this command reads ({path}): writing it would replace it; give another file" in err
        assert path.read_bytes() == before
    out = tmp_path / "trace.json.gz"
    assert main(["trace", str(path), "--perfetto", str(out)]) == 0
    assert json.loads(gzip.decompress(out.read_bytes()))["traceEvents"]


def test_a_header_without_engine_settings_is_refused(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"format": "tinyllm-recording", "version": 1, "engine": {}}\n')
    with pytest.raises(RecordingError, match=r":1: the header's \"engine\" settings are incomplete"):
        ReplayRunner(p)


def test_trace_refuses_a_record_of_the_wrong_shape(tmp_path, capsys):
    from tinyllm.cli import main

    p = tmp_path / "bad.jsonl"
    p.write_text(_header_line() + '\n{"step": 1, "snap": {"r": []}}\n')
    assert main(["trace", str(p)]) == 2
    assert "a broken record" in capsys.readouterr().err


def test_a_gz_recording_cut_off_mid_write_replays_what_came_before(tmp_path):
    path = tmp_path / "run.jsonl.gz"
    _, frames = record_run(path, "paged-tight")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])  # killed: the gzip stream ends early
    r = ReplayRunner(path)
    assert 0 < r.last_step < max(frames)
    assert r.warning is None or "cut off" in r.warning


def test_the_perfetto_trace_carries_speculations_drafts(tmp_path):
    path = tmp_path / "run.jsonl"
    eng, _ = record_run(path, "chunked-speculation")
    header, records, _ = read_recording(path)
    trace = json.loads(json.dumps(perfetto_trace(header, [r for _, r in records])))
    spec = [e for e in trace["traceEvents"] if e.get("name") == "speculative draft tokens"]
    c = eng.snapshot().counters
    assert c.spec_draft_tokens > 0 and spec[-1]["args"] == {
        "drafted": c.spec_draft_tokens,
        "kept": c.spec_accepted_tokens,
    }
    plain = tmp_path / "plain.jsonl"
    record_run(plain, "chunked-tight-prefix")
    header, records, _ = read_recording(plain)
    assert not [
        e for e in perfetto_trace(header, [r for _, r in records])["traceEvents"] if "speculative" in e.get("name", "")
    ]
