"""The engine in a child process: deltas rebuild the same frames, errors reach the user, the
child never outlives the app. Uses the bundled model (spawned children load it themselves)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from tinyllm.config import EngineConfig
from tinyllm.engine import ContinuousEngine, Sampling
from tinyllm.model.checkpoint import CheckpointError, default_model_dir, load_checkpoint
from tinyllm.request import RequestSettings
from tui.runners.child import ChildRunner, EngineStartError
from tui.runners.engine import EngineRunner
from tui.runners.engine_spec import EngineSpec
from tui.runners.frames import FrameDiffer, FrameMerger
from tui.runners.interface import SetPaused, StepOnce, Submit
from tui.screens.live import FramePacer


def wait_for(cond, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_deltas_rebuild_every_frame_exactly():
    """Run a real runner step by step; after each publish the merged delta equals the frame."""
    model, tok = load_checkpoint()
    eng = ContinuousEngine(model, 2, 96, generator=torch.Generator().manual_seed(0))
    runner = EngineRunner(eng, tok, paused=True)
    differ, merger = FrameDiffer(), FrameMerger()
    sizes = []
    for i in range(4):
        runner._apply(Submit(f"Line {i}:", RequestSettings(Sampling(0.8, top_k=20), 6 + 3 * i, True)))
    for _ in range(40):
        runner._publish()
        delta = differ.delta(runner.frame)
        sizes.append(len(delta.snapshot.requests))
        assert merger.merge(delta) == runner.frame
        if not eng.has_work():
            break
        runner._apply(StepOnce())
    assert runner.frame.snapshot.counters.finished == 4
    assert max(sizes) <= 4 and min(sizes[1:]) < 4  # unchanged requests are not resent


@pytest.fixture
def proc():
    runners = []

    def start(**kw):
        record = kw.pop("record", None)
        config = EngineConfig(
            device="cpu", max_num_seqs=kw.pop("slots", 2), max_len=kw.pop("max_len", 128), threads=1, **kw
        )
        spec = EngineSpec(str(default_model_dir()), config, record=record)
        r = ChildRunner(spec, paused=True).start(timeout=120)
        runners.append(r)
        return r

    yield start
    for r in runners:
        r.stop()
        assert not r._proc.is_alive()


def test_process_runner_generates_what_the_thread_runner_does(proc):
    runner = proc()
    threading.Thread(target=runner.run, daemon=True).start()
    model, tok = load_checkpoint()
    local = EngineRunner(ContinuousEngine(model, 2, 128), tok, paused=True)
    for r in (runner, local):
        r.send(Submit("ROMEO:\n", RequestSettings(Sampling(), 10, False)))
    local._drain(block=False)
    wait_for(lambda: len(runner.frame.snapshot.requests) == 1)
    for _ in range(12):
        n = runner.frame.steps_done
        runner.send(StepOnce())
        wait_for(lambda: runner.frame.steps_done > n or runner.frame.snapshot.counters.finished)
        local._apply(StepOnce())
    local._publish()
    assert runner.frame.snapshot.counters.finished == 1
    assert runner.frame.texts == local.frame.texts and runner.frame.texts[0]
    assert runner.frame.snapshot.requests[0].tokens == local.frame.snapshot.requests[0].tokens
    assert runner.device == "cpu"


def test_the_engine_process_records_what_the_app_received(proc, tmp_path):
    """--record: the child writes the run; replayed, its last frame is the app's last frame."""
    from tui.runners.replay import ReplayRunner

    path = tmp_path / "run.jsonl"
    runner = proc(record=str(path), kv="paged", chunked_prefill=True)
    t = threading.Thread(target=runner.run, daemon=True)
    t.start()
    runner.send(Submit("ROMEO:\n", RequestSettings(Sampling(), 8, False)))
    runner.send(SetPaused(False))
    wait_for(lambda: runner.frame.snapshot.counters.finished == 1 and runner.frame.texts.get(0))
    wait_for(lambda: runner.frame.paused is False and not runner.frame.snapshot.queue)
    last = runner.frame
    runner.stop()  # the child closes the file as it exits
    t.join(10)
    replay = ReplayRunner(path, paused=True)
    assert replay.header["settings"]["chunked_prefill"] is True and replay.header["model"] == default_model_dir().name
    assert replay.frame.snapshot.requests and replay.last_step == last.snapshot.counters.steps
    replay.apply(StepOnce())
    while not replay.at_end:
        replay.apply(StepOnce())
    assert replay.frame.snapshot == last.snapshot and replay.frame.texts == last.texts


def test_an_unwritable_record_file_is_a_start_error(tmp_path):
    config = EngineConfig(device="cpu", max_num_seqs=2, max_len=64, threads=1)
    spec = EngineSpec(str(default_model_dir()), config, record=str(tmp_path / "no" / "run.jsonl"))
    with pytest.raises(EngineStartError, match="No such file"):
        ChildRunner(spec).start(timeout=120)


def test_bad_checkpoint_and_bad_settings_are_reported_not_hung(tmp_path):
    src = default_model_dir()
    for name in ("config.json", "tokenizer.json"):
        (tmp_path / name).write_bytes((src / name).read_bytes())
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="safetensors"):
        ChildRunner(EngineSpec(str(tmp_path))).start(timeout=120)
    with pytest.raises(EngineStartError, match="max_len"):  # (a setting only the model can refuse)
        ChildRunner(EngineSpec(str(src), EngineConfig(max_len=4096))).start(timeout=120)


def test_a_killed_engine_process_is_reported_and_commands_are_dropped(proc):
    runner = proc()
    t = threading.Thread(target=runner.run, daemon=True)
    t.start()
    os.kill(runner._proc.pid, signal.SIGKILL)
    t.join(10)
    assert not t.is_alive()
    last = runner.frame.log[-1]
    assert last.kind == "error" and "exited unexpectedly" in last.text
    runner.send(SetPaused(False))  # no exception: the app stays usable


def test_the_child_exits_when_the_app_stops(proc):
    runner = proc()
    runner.stop()
    assert not runner._proc.is_alive() and runner._proc.exitcode == 0


# -- frame pacing ------------------------------------------------------------------------------
class FakeClock:
    def __init__(self):
        self.t = 0.0
        self.cpu = 0.0


def drawn_per_second(pacer: FramePacer, clock: FakeClock, cost_s: float, seconds: int = 10) -> float:
    """Tick at 20 Hz for ``seconds``; each drawn frame costs ``cost_s`` of CPU. Frames/s in the last second."""
    last = 0
    for tick in range(seconds * 20):
        clock.t += 0.05
        if pacer.due():
            clock.cpu += cost_s
            if tick >= (seconds - 1) * 20:
                last += 1
    return last


def test_pacer_keeps_full_rate_when_drawing_is_cheap_and_backs_off_when_not():
    clock = FakeClock()
    pacer = FramePacer(max_hz=20, min_hz=5, budget=0.10, cpu=lambda: clock.cpu, clock=lambda: clock.t)
    assert drawn_per_second(pacer, clock, cost_s=0.001) == 20  # 2% of a core: no change
    slow = drawn_per_second(pacer, clock, cost_s=0.012)  # 24% at 20 Hz: must slow down
    assert 5 <= slow <= 10 and slow * 0.012 <= 0.10 * 1.3
    assert drawn_per_second(pacer, clock, cost_s=0.1) == 5  # never below min_hz
    assert drawn_per_second(pacer, clock, cost_s=0.0005) == 20  # and it recovers


# -- starting without waiting (the app's way: screen first, engine second) ----------------------
def test_the_app_side_imports_no_torch():
    """The first frame must not wait for torch: the app, its runner and widgets import without it."""
    heavy = ("torch", "prometheus_client", "httpx")  # the last two: only when attached to a server
    code = (
        "import sys, tui.cli, tui.runners.child, tui.screens.modals, tui.screens.settings, tui.screens.picker, tinyllm.model.config, tinyllm.workload; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r}))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
    code = "import sys, tui.runners.replay, tui.runners.attach, tui.runners.vllm; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", "replay and attach must not load torch"


def test_a_loading_runner_shows_the_layout_and_keeps_early_commands():
    spec = EngineSpec(
        str(default_model_dir()), EngineConfig(max_num_seqs=3, max_len=128, kv="paged", block_size=8, threads=1)
    )
    runner = ChildRunner(spec, paused=True).start(wait=False)
    try:
        f = runner.frame
        assert f.status == "loading" and f.paused and runner.device == "?"
        assert f.snapshot.n_slots == 3 and all(s.free for s in f.snapshot.slots)
        assert f.snapshot.kv.n_blocks == 3 * 16 and f.snapshot.kv.free_blocks == 48
        runner.send(Submit("ROMEO:\n", RequestSettings(Sampling(), 4, False)))  # before the engine exists
        runner.send(StepOnce())
        assert runner.early_prompts == 1  # the status line says so while it loads
        threading.Thread(target=runner.run, daemon=True).start()
        wait_for(lambda: runner.frame.snapshot.counters.steps == 1)
        assert runner.ready and runner.device == "cpu" and runner.frame.status == "ready"
        assert runner.early_prompts == 0
        assert len(runner.frame.snapshot.request(0).tokens) == 2  # admitted + one decode: in order
    finally:
        runner.stop()


def test_a_start_error_without_waiting_is_kept_for_the_app(tmp_path):
    src = default_model_dir()
    for name in ("config.json", "tokenizer.json"):
        (tmp_path / name).write_bytes((src / name).read_bytes())
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors")
    runner = ChildRunner(EngineSpec(str(tmp_path)), max_len=64).start(wait=False)
    t = threading.Thread(target=runner.run, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive()
    assert isinstance(runner.start_error, CheckpointError) and "safetensors" in str(runner.start_error)
    assert runner.frame.status == "failed"
    assert not any(e.kind == "error" for e in runner.frame.log)  # the app reports it, once, as it exits
    runner.send(StepOnce())  # dropped quietly
    runner.stop()
