"""SLOs in the lab: workload lines' own SLOs, each request judged per lane, each lane's goodput,
the ranking's rule said in words, a recording's aborted request marked and left out, and the
same JSON twice on the cost clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import race_run, random_model
from tinyllm.cli import main as tinyllm_main
from tinyllm.engine import Request
from tinyllm.race.race import build_race
from tinyllm.race.spec import parse_lanes
from tinyllm.race.verdicts import Judging, rank
from tinyllm.race.whatif import compare, load_judging, to_json
from tinyllm.slo import SLO
from tinyllm.workload import WorkloadError, load_workload

RECORDING = Path(__file__).parent / "data" / "preemption-run.jsonl"
PROFILE = Path(__file__).parent / "data" / "cost-profile.json"


def test_a_workload_line_has_its_own_slo(tmp_path):
    wl = tmp_path / "w.jsonl"
    wl.write_text(
        '{"prompt": "a", "arrival_s": 1.0, "slo": "ttft=300ms"}\n'
        '{"prompt": "b", "n": 2, "slo": {"tpot": "20ms"}}\n'
        '{"prompt": "c", "arrival_s": 0.5}\n'
    )
    items = load_workload(wl)
    assert [it.slo for it in items] == [SLO(ttft_s=0.3), SLO(tpot_s=0.02), None]
    run = SLO(ttft_s=1.0)
    j = load_judging(str(wl), run)  # in arrival order, as the lanes number them: b, b, c, a
    assert j.own == (SLO(tpot_s=0.02), SLO(tpot_s=0.02), None, SLO(ttft_s=0.3))
    assert [j.slo_for(rid) for rid in range(4)] == [SLO(tpot_s=0.02), SLO(tpot_s=0.02), run, SLO(ttft_s=0.3)]


@pytest.mark.parametrize(
    "slo, words",
    [('"ttft=300"', "give a unit, ms or s"), ('"e2e=1s"', "unknown SLO target 'e2e'"), ("5", "expected a string")],
)
def test_a_bad_slo_on_a_line_names_the_file_and_line(tmp_path, slo, words):
    wl = tmp_path / "w.jsonl"
    wl.write_text(f'{{"prompt": "a"}}\n{{"prompt": "b", "slo": {slo}}}\n')
    with pytest.raises(WorkloadError) as e:
        load_workload(wl)
    assert str(e.value).startswith(f"{wl}:2: ") and words in str(e.value) and "\n" not in str(e.value)


@pytest.fixture(scope="module")
def model():
    return random_model(seed=2, vocab=256, d_model=32, n_layers=1, max_seq_len=256)


def lanes_on(model, arrivals, lanes=("static", "chunked")):
    race = build_race(model, arrivals, race_run(2, 128, block_size=8), lanes=parse_lanes(list(lanes)), step_cost_s=0.01)
    while race.step() is not None:
        pass
    return race.views()


def test_without_arrivals_lanes_are_ranked_by_finishing_time(model):
    views = lanes_on(model, [(0.0, Request([1 + i] * (4 + 3 * i), 4 + 6 * (i % 3))) for i in range(6)])
    r = rank(views, Judging(SLO(ttft_s=0.05)))
    assert r.by == "finishing time" and r.rule.startswith("ranked by finishing time (no arrivals")
    fastest = min(range(len(views)), key=lambda i: views[i].result.wall_s)
    assert r.places[fastest] == 1


def test_with_arrivals_lanes_are_ranked_by_goodput_and_each_request_is_judged(model):
    arrivals = [(0.03 * i, Request([1 + i] * (4 + 3 * i), 4 + 6 * (i % 3))) for i in range(6)]
    views = lanes_on(model, arrivals)
    judging = Judging(SLO(ttft_s=0.02))
    r = rank(views, judging)
    assert r.by == "goodput" and "(requests arrive over time)" in r.rule
    sums = [judging.summary(v) for v in views]
    assert all(s.judged == 6 and s.span_s == v.result.wall_s for s, v in zip(sums, views))
    best = max(range(2), key=lambda i: (sums[i].goodput, -i))
    assert r.places[best] == 1
    doc = to_json(views, compare(views, judging), "test", judging)
    assert doc["slo"] == "ttft=20ms" and doc["ranking"]["rule"] == r.rule
    for lane, s in zip(doc["lanes"], sums):
        assert lane["slo"]["goodput_rps"] == round(s.goodput, 6) and lane["slo"]["met"] == s.met
    for req in doc["requests"]:
        for o in req["lanes"].values():
            assert o["slo"]["outcome"] in ("met", "missed")
            assert (o["slo"]["outcome"] == "met") == (o["ttft_s"] <= 0.02)
    assert rank(views, Judging()).by == "latency p95"  # no SLO: latency alone, said so
    assert "--slo ranks by goodput first" in rank(views, Judging()).rule


def whatif_json(tmp_path, name, *extra):
    out = tmp_path / name
    args = ["whatif", str(RECORDING), "--lanes", "fcfs", "budget=32 blocks=24", "--max-len", "256"]
    assert tinyllm_main([*args, "--json", str(out), *extra]) == 0
    return out.read_text()


def test_whatif_judges_every_request_marks_the_aborted_one_and_gives_the_same_json_twice(tmp_path, capsys):
    """On the cost clock (a fixed profile: no fitting in a test) the SLO verdicts are the clock's,
    so the same command writes the same JSON; the request the recording saw aborted is marked,
    judged apart and left out of "most changed" and of the ranking."""
    extra = ("--cost-profile", str(PROFILE), "--slo", "ttft=50ms,tpot=20ms")
    first = whatif_json(tmp_path, "a.json", *extra)
    text = capsys.readouterr().out
    assert first == whatif_json(tmp_path, "b.json", *extra)
    doc = json.loads(first)
    assert doc["slo"] == "ttft=50ms,tpot=20ms"
    assert doc["ranking"]["by"] == "goodput" and "1 request aborted or failed" in doc["ranking"]["rule"]
    assert sorted(doc["ranking"]["places"]) == [1, 2]
    for lane in doc["lanes"]:
        s = lane["slo"]
        assert s["aborted"] == 1 and s["met"] + s["missed"] == 5 and s["goodput_rps"] > 0
    aborted = [r for r in doc["requests"] if r["recorded_state"] == "aborted"]
    assert len(aborted) == 1 and doc["requests"][-1] is not None
    assert doc["requests"][-1]["recorded_state"] == "aborted"  # last: not among "most changed"
    assert aborted[0]["e2e_change_vs_first_lane"] is None
    assert all(o["slo"]["outcome"] == "aborted" for o in aborted[0]["lanes"].values())
    missed = [o for r in doc["requests"] for o in r["lanes"].values() if o["slo"]["outcome"] == "missed"]
    assert missed and all(o["slo"]["reason"] in o["waited_steps"] for o in missed)
    assert "ranked by goodput, then latency p95" in " ".join(text.split())
    assert "goodput" in text and "aborted" in text


def test_whatif_refuses_a_bad_slo_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:  # argparse's own exit, one line
        tinyllm_main(["whatif", str(RECORDING), "--lanes", "fcfs", "priority", "--slo", "ttft=5"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--slo" in err and "give a unit, ms or s" in err and len(err.strip().splitlines()) == 1


def test_lanes_within_the_clocks_error_tie_and_the_rule_says_so(model):
    """fcfs ranked first by 0.02 s of latency p95 with no sentence why: a lead inside the clock's
    error is no verdict."""
    from dataclasses import replace

    from tinyllm.race.verdicts import TIE_WITHIN

    views = lanes_on(
        model,
        [(0.0, Request([1 + i] * (4 + 3 * i), 4 + 6 * (i % 3))) for i in range(6)],
        ("fcfs", "priority", "static"),
    )
    base = views[0].result.wall_s
    near = replace(views[1], result=replace(views[1].result, wall_s=base * (1 + TIE_WITHIN / 2)))
    far = replace(views[2], result=replace(views[2].result, wall_s=base * (1 + 3 * TIE_WITHIN)))
    r = rank((views[0], near, far))
    assert r.places == (1, 1, 3)
    assert f"{views[0].title} and {near.title} tie: within 5% on finishing time, inside the clock's error" in r.rule
    assert rank((views[0], far)).places == (1, 2) and "tie" not in rank((views[0], far)).rule
