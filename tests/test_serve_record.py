"""`tinyllm serve --record FILE`: the server's recording of the traffic it saw, read back by
tune / whatif (requests_from_recording), with the text left out unless --record-text."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import httpx
import pytest

from tests.helpers import cli_refusal
from tests.test_app import _watch, bundled, until
from tinyllm.observe.recording import read_recording, recorded_verdicts
from tinyllm.observe.snapshot import RequestView
from tinyllm.race.whatif import recorded_views, requests_from_recording
from tinyllm.request import Sampling
from tinyllm.serve import EngineLoop, ServerThread, build_engine, create_app
from tinyllm.serve.recorder import RecordTo, TokenMask
from tinyllm.slo import SLO
from tui.app import TinyLLMApp
from tui.runners.replay import ReplayRunner

PROMPTS = ("ROMEO:\nWherefore art thou Romeo", "ROMEO:\nWherefore art thou here, good friar")


def record_two(path, text: bool, slo: SLO | None = None) -> list[dict]:
    """Two requests, 0.3 s apart, to a server recording to ``path``: their responses' usage."""
    model, tok = bundled()
    app = create_app(EngineLoop(build_engine(model, slots=2)), tok, "m", slo=slo, record=RecordTo(path, text))
    usage = []
    with ServerThread(app) as s:
        for p in PROMPTS:
            r = httpx.post(s.url + "/v1/completions", json={"model": "m", "prompt": p, "max_tokens": 6}, timeout=60)
            usage.append(r.json()["usage"])
            time.sleep(0.3)
    return usage


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> tuple:
    """A recording made without --record-text, and its requests' usage."""
    path = tmp_path_factory.mktemp("rec") / "run.jsonl"
    return path, record_two(path, text=False)


def test_a_recording_without_text_keeps_lengths_and_arrivals_not_the_text(plain):
    path, usage = plain
    reqs, warning = requests_from_recording(path)
    assert warning is None and len(reqs) == 2
    assert [len(r.prompt) for _, r in reqs] == [u["prompt_tokens"] for u in usage]
    assert [r.max_new_tokens for _, r in reqs] == [u["completion_tokens"] for u in usage]
    assert reqs[0][0] == 0.0 and reqs[1][0] >= 0.3
    raw = path.read_text()
    header, records, _ = read_recording(path)
    assert header["text"] is False
    assert not any("prompt" in rec or "text" in rec for _, rec in records)
    assert "Wherefore" not in raw and "ROMEO" not in raw
    _, tok = bundled()
    views, _ = recorded_views(path)
    for view, p in zip(views, PROMPTS, strict=True):
        assert list(view.prompt) != tok.encode(p)  # the ids are scrambled...
    shared = len(os.path.commonprefix([tok.encode(p) for p in PROMPTS]))
    a, b = (v.prompt for v in views)
    assert a[:shared] == b[:shared] and a[shared] != b[shared]  # ...the shared prefix kept


def test_record_text_keeps_the_text_and_slo_writes_verdicts(tmp_path):
    path = tmp_path / "run.jsonl.gz"
    record_two(path, text=True, slo=SLO.parse("ttft=60s,tpot=10s"))
    header, records, _ = read_recording(path)
    assert header["text"] is True and header["slo"]
    prompts = {p for _, rec in records for p in (rec.get("prompt") or {}).values()}
    assert prompts == set(PROMPTS)
    verdicts = recorded_verdicts([rec for _, rec in records])
    assert len(verdicts) == 2 and all(v.outcome == "met" for v, _ in verdicts.values())


def test_the_mask_is_a_permutation():
    m = TokenMask(50)
    assert sorted(m.ids(tuple(range(50)))) == list(range(50))


@pytest.mark.parametrize("case", ["exists", "no-dir", "unwritable-dir", "a-dir", "text-alone"])
def test_a_bad_record_file_is_one_line_and_exit_2(tmp_path, case, capsys, monkeypatch):
    existing = tmp_path / "old.jsonl"
    existing.write_text(json.dumps({"format": "tinyllm-recording"}) + "\n")
    args = {
        "exists": ["--record", str(existing)],
        "no-dir": ["--record", str(tmp_path / "nope" / "run.jsonl")],
        "unwritable-dir": ["--record", "/proc/run.jsonl"],  # (even for root)
        "a-dir": ["--record", str(tmp_path)],
        "text-alone": ["--record-text"],
    }[case]

    def served(*_a, **_k):  # a refusal missed: fail here instead of serving forever
        raise AssertionError(f"{args} was not refused")

    monkeypatch.setattr("tinyllm.serve.server.run_server", served)
    assert "--record" in cli_refusal(["serve", "--port", "0", *args], capsys)
    assert existing.read_text() == json.dumps({"format": "tinyllm-recording"}) + "\n"  # not written over


async def test_a_recording_without_text_replays_with_lengths(plain):
    path, usage = plain
    app = TinyLLMApp(ReplayRunner(path, paused=True), None, model_name="m")
    _watch(app)
    r = app.runner
    async with app.run_test(size=(140, 44)) as pilot:
        await pilot.press("greater_than_sign")  # the last step
        await until(pilot, lambda: r.frame.snapshot.counters.steps == r.last_step, what="the last step")
        views = r.frame.snapshot.requests
        assert [len(v.prompt) for v in views] == [u["prompt_tokens"] for u in usage]
        assert [v.state for v in views] == ["finished", "finished"]


def test_the_mask_follows_a_view_as_it_grows():
    m = TokenMask(50)
    v = RequestView(
        rid=0,
        state="running",
        slot=0,
        prompt=(1, 2, 3),
        tokens=(4,),
        max_new_tokens=8,
        sampling=Sampling(),
        eos_id=None,
        arrival_s=0.0,
        first_token_s=None,
        finish_s=None,
        preemptions=0,
    )
    a = m.view(v)
    assert m.view(v) is a  # an unchanged view: the same masked one
    grown = m.view(replace(v, tokens=(4, 5, 6)))
    assert grown.prompt == a.prompt == m.ids((1, 2, 3)) and grown.tokens == m.ids((4, 5, 6))
    assert m.view(replace(v, tokens=(7,))).tokens == m.ids((7,))


def test_ctrl_c_closes_the_recording(tmp_path):
    path = tmp_path / "run.jsonl.gz"
    p = subprocess.Popen(
        [sys.executable, "-m", "tinyllm.cli", "serve", "--port", "0", "--slots", "2", "--record", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        line = p.stdout.readline()  # blocks until ready (or exit)
        assert f"recording to {path}, text left out" in line, (line, p.stderr.read())
        url = line.split()[4]
        r = httpx.post(url + "/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 3}, timeout=30)
        assert r.status_code == 200
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 130 and err == "", (out, err)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)
    reqs, warning = requests_from_recording(path)  # a whole gzip file: closed, not cut off
    assert warning is None and [r.max_new_tokens for _, r in reqs] == [3]
