"""The cost clock: a step's time from its work, the same model for every lane, so a race or a
what-if gives the same figures every run, quiet machine or not."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import race_run, random_model
from tinyllm.cli import main as tinyllm_main
from tinyllm.engine import Request
from tinyllm.race import calibrate
from tinyllm.race.calibrate import cost_profile
from tinyllm.race.cost import CostModel, PassWork, fit, fit_error
from tinyllm.race.race import build_race

PROFILE = Path(__file__).parent / "data" / "cost-profile.json"


def test_a_fit_recovers_the_coefficients_that_made_the_times():
    truth = CostModel(0.002, 3e-5, 4e-5, 6e-9)
    works = [
        PassWork(r, t, k, p)
        for r, t, k, p in [
            (1, 1, 50, 1),
            (8, 8, 900, 1),
            (4, 200, 800, 1),
            (16, 16, 4000, 2),
            (2, 64, 64, 1),
            (32, 32, 9000, 1),
            (8, 300, 2400, 2),
            (1, 128, 128, 1),
        ]
    ]
    fitted = fit([(w, truth.cost(w)) for w in works])
    for got, want in zip(vars(fitted).values(), vars(truth).values()):
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-4, abs=1e-12)
    assert fit_error(fitted, [(w, truth.cost(w)) for w in works])[1] < 1e-4


def test_a_fit_never_gives_a_negative_cost_and_a_bad_profile_is_refused(tmp_path):
    noisy = [(PassWork(r, r, 0), 0.001 - 1e-6 * r) for r in range(1, 20)]  # time falling with rows
    assert all(c >= 0 for c in list(vars(fit(noisy)).values())[:4])
    with pytest.raises(ValueError, match="at least 4 timed passes"):
        fit(noisy[:2])
    bad = tmp_path / "p.json"
    bad.write_text('{"fixed_s": -1, "per_row_s": 0, "per_token_s": 0, "per_kv_token_s": 0}')
    with pytest.raises(ValueError, match="coefficients are finite numbers >= 0"):
        CostModel.load(bad)
    bad.write_text("not json")
    with pytest.raises(ValueError, match="not a cost profile"):
        CostModel.load(bad)
    assert CostModel.load(PROFILE).per_token_s == 4e-05


def race_figures(model, profile):
    work = [
        (0.05 * i, Request([1 + (7 * i + j) % 200 for j in range(5 + 9 * (i % 5))], 4 + 5 * (i % 4))) for i in range(10)
    ]
    race = build_race(model, work, race_run(3, 128), lanes=("static", "continuous", "chunked"), step_cost_s=profile)
    while race.step() is not None:
        pass
    return [(v.title, vars(v.result)) for v in race.views()]


def test_a_race_on_the_cost_clock_gives_the_same_figures_every_time_even_beside_a_busy_core():
    model, profile = random_model(), CostModel.load(PROFILE)
    quiet = race_figures(model, profile)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        loaded = race_figures(model, profile)
    finally:
        busy.kill()
    assert quiet == loaded
    by_kind = dict(quiet)
    assert len(by_kind) == 3 and all(r["wall_s"] > 0 for r in by_kind.values())


def test_static_batchings_waste_is_rows_it_pays_for_not_a_slower_kernel():
    """A static decode pass pays for every row of its batch (finished ones too): the waste shows
    as work on the same clock, priced as any other scheduler's rows."""
    from tinyllm.engine.static import StaticBatcher

    eng = StaticBatcher(random_model(), 3)
    passes = []
    eng.on_pass = lambda rows: passes.append(PassWork.of_rows(rows))
    for p, n in (([5, 6, 7], 2), ([5, 6], 9), ([5, 6, 7, 8], 9)):
        eng.add_request(Request(p, n))
    eng.step()
    assert passes == [PassWork(3, 9, 9)]  # the prefill: every prompt, no padding computed
    for _ in range(4):
        eng.step()
    assert len(eng.results) == 1  # one row done, still computed
    # the 4th decode: every row attends its own prompt + 4 tokens (3 generated before, 1 written now)
    assert passes[-1] == PassWork(3, 3, (3 + 4) + (2 + 4) + (4 + 4))


def test_whatif_twice_on_the_cost_clock_writes_the_same_json_and_says_which_clock(tmp_path, capsys):
    wl = tmp_path / "small.jsonl"
    wl.write_text(
        "".join(
            f'{{"prompt": "ROMEO:\\n{i}", "max_new_tokens": {8 + 6 * i}, "arrival_s": {0.05 * i}}}\n' for i in range(6)
        )
    )
    outs = []
    for i in range(2):
        out = tmp_path / f"w{i}.json"
        args = ["whatif", str(wl), "--lanes", "static", "chunked", "--cost-profile", str(PROFILE), "--json", str(out)]
        assert tinyllm_main(args) == 0
        outs.append(json.loads(out.read_text()))
    assert outs[0] == outs[1] and outs[0]["clock"]["kind"] == "cost"
    said = capsys.readouterr().out
    assert "cost clock:" in said and "the same figures every run" in said
    assert (
        tinyllm_main(
            ["whatif", "burst", "--lanes", "fcfs", "priority", "--clock", "wall", "--cost-profile", str(PROFILE)]
        )
        == 2
    )
    assert "--cost-profile is the cost clock's" in capsys.readouterr().err


def quick_calibration(monkeypatch):
    """One round of a smaller calibration workload: the same code, a fraction of the time."""
    full = calibrate.calibration_workload
    monkeypatch.setattr(calibrate, "MIN_ROUNDS", 1)
    monkeypatch.setattr(calibrate, "MAX_ROUNDS", 1)
    monkeypatch.setattr(calibrate, "calibration_workload", lambda *a, **k: full(*a, **k)[:6])


def test_the_profile_is_calibrated_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.delenv("TINYLLM_COST_PROFILE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(calibrate, "GOOD_FIT", 100.0)  # (how good the fit is depends on the machine's load)
    quick_calibration(monkeypatch)
    model = random_model()
    said: list[str] = []
    first = cost_profile(model, say=said.append)
    assert any("calibrating" in s for s in said) and list((tmp_path / "tinyllm" / "cost").glob("*.json"))
    assert "median error" in first.source
    said.clear()
    assert cost_profile(model, say=said.append) == first and said == []


def test_a_poor_fit_is_used_for_the_run_but_not_cached(tmp_path, monkeypatch):
    monkeypatch.delenv("TINYLLM_COST_PROFILE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(calibrate, "GOOD_FIT", -1.0)
    quick_calibration(monkeypatch)
    said: list[str] = []
    assert isinstance(cost_profile(random_model(), say=said.append), CostModel)
    assert any("not kept" in s for s in said) and not list((tmp_path / "tinyllm" / "cost").glob("*.json"))


def test_lanes_that_make_the_same_decisions_are_said_to_and_not_ranked(tmp_path, capsys):
    """A recording without priorities replayed under fcfs and priority: the same steps, waits and
    preemptions; the table ranked wall-clock noise as "most changed" requests."""
    out = tmp_path / "w.json"
    recording = Path(__file__).parent / "data" / "preemption-run.jsonl"
    assert tinyllm_main(["whatif", str(recording), "--lanes", "fcfs", "priority", "--json", str(out)]) == 0
    said = capsys.readouterr().out
    assert "identical schedules: priority made the same decisions as fcfs on every step" in said
    assert "most changed" not in said and json.loads(out.read_text())["identical_schedules"] == ["priority"]


def test_the_burst_race_ranks_continuous_above_static_every_time():
    """`--race burst --slots 4` (arrivals at 0 s and 4 s) ranked static 2nd one run and 3rd the
    next on the wall clock. On the cost clock, with burst's output lengths and arrivals, the
    ranking (latency p95: requests arrive over time) is the schedules' and the same each run."""
    import json as json_

    from tinyllm.race.verdicts import rank
    from tinyllm.workload import bundled_workloads

    lines = [json_.loads(x) for x in bundled_workloads()["burst"].read_text().splitlines() if x.strip()]
    work = [(line["arrival_s"], Request([3 + i % 50, 4, 5], line["max_new_tokens"])) for i, line in enumerate(lines)]
    profile = CostModel.load(PROFILE)
    places = []
    for _ in range(2):
        race = build_race(
            random_model(max_seq_len=256), work, race_run(4, 256), lanes=("static", "continuous"), step_cost_s=profile
        )
        while race.step() is not None:
            pass
        ranking = rank(race.views())
        assert ranking.by == "latency p95"
        places.append((ranking.places, [v.result for v in race.views()]))
    assert places[0] == places[1] and places[0][0] == (2, 1)  # continuous first, both times, the same figures


def test_the_bundled_model_rests_on_the_reference_profile_until_this_machine_measures_one(
    tmp_path, monkeypatch, model_tok
):
    """No profile of this machine yet: the shipped reference, no calibration (the first run on
    any machine gives the figures every later run gives); 'measure' fits one here and, fitting
    well, later runs rest on it; 'reference' asks for the shipped one whatever is kept."""
    monkeypatch.delenv("TINYLLM_COST_PROFILE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model, _ = model_tok
    said: list[str] = []
    reference = cost_profile(model, say=said.append)
    assert said == [] and reference == CostModel.load(calibrate.REFERENCE)
    assert reference.source.startswith("reference: the bundled model measured on a quiet")
    monkeypatch.setattr(calibrate, "GOOD_FIT", 100.0)  # (how good the fit is depends on the machine's load)
    quick_calibration(monkeypatch)
    measured = cost_profile(model, "measure", say=said.append)
    assert any("calibrating" in s for s in said) and "fitted on this machine over" in measured.source
    assert cost_profile(model, say=said.append) == measured  # kept: later runs rest on it
    assert cost_profile(model, "reference") == reference


def test_reference_is_the_bundled_models_only_and_said_so():
    with pytest.raises(ValueError, match="reference profile for the bundled model on the CPU only"):
        cost_profile(random_model(), "reference")


def test_a_calibration_keeps_each_passes_fastest_time_and_stops_once_converged(monkeypatch):
    """Contention only ever adds time: a round in which every pass ran 1000x slower (a busy core)
    changes no pass's time, and a round that lowers the total by less than CONVERGED, from
    MIN_ROUNDS on, ends the calibration, saying so."""
    from tinyllm.race import race as race_module

    build = race_module.build_race
    rounds = [0]

    def counting_build(*a, **k):
        """Each round's race; the third's passes all timed 1000x slower, as beside a busy core."""
        rounds[0] += 1
        race = build(*a, **k)
        step = race.step

        def slowed_step():
            out = step()
            if out is None and rounds[0] == 3:
                for lane in race.lanes:
                    lane.clock.samples = [(w, 1000 * s) for w, s in lane.clock.samples]
            return out

        race.step = slowed_step
        return race

    monkeypatch.setattr(race_module, "build_race", counting_build)
    full = calibrate.calibration_workload
    monkeypatch.setattr(calibrate, "calibration_workload", lambda *a, **k: full(*a, **k)[:4])
    said: list[str] = []
    _, _, n, how_far = calibrate.calibrate(random_model(), say=said.append)
    total = said[1].split("fastest times ")[1].split(" in all")[0]
    assert said[2].endswith(f"fastest times {total} in all (0.0% lower)"), said  # the slow round lowered nothing
    assert rounds[0] == len(said) == calibrate.MIN_ROUNDS == 3 and n > 0
    assert how_far == "converged in 3 rounds: the last lowered the total by 0.0%"


def test_whatif_on_a_fresh_machine_rests_on_the_reference_and_a_busy_core_changes_no_figure(
    tmp_path, monkeypatch, capsys
):
    """No profile kept yet and none given: the reference, named in the output and the JSON; the
    same JSON run beside a core kept busy."""
    monkeypatch.delenv("TINYLLM_COST_PROFILE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    wl = tmp_path / "small.jsonl"
    wl.write_text(
        "".join(
            f'{{"prompt": "ROMEO:\\n{i}", "max_new_tokens": {6 + 4 * i}, "arrival_s": {0.05 * i}}}\n' for i in range(5)
        )
    )
    outs = []
    for busy in (False, True):
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            out = tmp_path / f"w{busy}.json"
            assert tinyllm_main(["whatif", str(wl), "--lanes", "static", "chunked", "--json", str(out)]) == 0
        finally:
            if spinner is not None:
                spinner.kill()
        outs.append(json.loads(out.read_text()))
    assert outs[0] == outs[1] and outs[0]["clock"]["source"].startswith("reference: the bundled model")
    said = capsys.readouterr()
    assert "calibrating" not in said.err and "reference: the bundled model measured on a quiet" in said.out
