"""The race's engine side (no textual): the stepwise static batcher, lane clocks, who steps
next, arrivals, and the finish line's figures against the headless paths."""

from __future__ import annotations

import pytest

from tests.helpers import mixed_workload, race_run, random_model, solo_outputs
from tinyllm.engine import Request, run_continuous, run_static
from tinyllm.engine.static import StaticBatcher
from tinyllm.model.config import default_model_dir, load_config_and_tokenizer
from tinyllm.race import clock as clock_mod
from tinyllm.race.clock import LaneClock
from tinyllm.race.race import build_race
from tinyllm.race.rules import check_static_batches
from tinyllm.request import ContextTooLong
from tinyllm.workload import bundled_workloads
from tui.runners.race import race_workload


@pytest.fixture(scope="module")
def model():
    return random_model(max_seq_len=128)


def greedy(reqs: list[Request]) -> list[Request]:
    """The race's requests: greedy, no end-of-text (every lane makes the same tokens)."""
    return [Request(r.prompt, r.max_new_tokens) for r in reqs]


def run_race(race) -> None:
    while race.step() is not None:
        pass


# -- the stepwise static batcher -------------------------------------------------------------------
def test_static_batcher_is_one_forward_pass_per_step_and_counts_wasted_rows(model):
    reqs = [Request([1, 2, 3], n) for n in (2, 5, 3)] + [Request([4, 5], n) for n in (1, 4)]
    eng = StaticBatcher(model, 3)
    for r in reqs:
        eng.add_request(r)
    seen = []
    while eng.has_work():
        eng.step()
        seen.append([(r.rid, r.done, r.generated) for r in eng.rows()])
    # batch 1 (max_new 2, 5, 3): prefill + 4 decodes; batch 2 (1, 4): prefill + 3 decodes
    assert eng.steps == 5 + 4
    assert seen[1] == [(0, True, 2), (1, False, 2), (2, False, 2)]  # #0 done: still a row, wasted
    assert seen[3] == [(0, True, 2), (1, False, 4), (2, True, 3)]
    assert seen[4] == []  # batch over, next not started
    st = eng.stats
    assert st.decode_steps == 4 + 3
    assert st.computed_rows == 3 * 4 + 2 * 3  # every row of the batch, each step
    assert st.useful_rows == (1 + 4 + 2) + (0 + 3)  # rows still generating
    assert [len(eng.results[i].tokens) for i in range(5)] == [2, 5, 3, 1, 4]


def test_static_batcher_greedy_equals_solo_and_run_static(model):
    reqs = mixed_workload(11, seed=3)
    results, summary = run_static(model, reqs, 4)
    assert [r.tokens for r in results] == solo_outputs(model, reqs)
    eng = StaticBatcher(model, 4)
    rids = [eng.add_request(r, arrival=0.0) for r in reqs]
    while eng.has_work():
        eng.step()
    assert [eng.results[r].tokens for r in rids] == [r.tokens for r in results]
    assert eng.stats.decode_steps == summary["decode_steps"]
    assert eng.stats.useful_rows / eng.stats.computed_rows == summary["row_util"]


def test_static_batcher_waits_for_a_full_batch_or_the_timeout():
    model = random_model(max_seq_len=64)
    t = {"now": 0.0}
    eng = StaticBatcher(model, 3, clock=lambda: t["now"], batch_timeout_s=1.0)
    eng.more_coming = True
    eng.add_request(Request([1, 2], 2), arrival=0.0)
    eng.add_request(Request([3], 2), arrival=0.2)
    assert not eng.ready() and eng.deadline() == 1.0  # 2 of 3, the oldest waited 0 s
    t["now"] = 0.99
    assert not eng.ready() and eng.step() == []
    t["now"] = 1.0  # the oldest has waited 1 s
    assert eng.ready()
    eng.step()
    assert [r.rid for r in eng.rows()] == [0, 1]  # a partial batch
    while eng.batch:
        eng.step()
    for _ in range(3):
        eng.add_request(Request([5], 1), arrival=2.0)
    assert eng.ready()  # a full batch starts at once
    eng.step()
    eng.add_request(Request([6], 1), arrival=3.0)
    eng.more_coming = False
    assert eng.ready()  # nothing more coming: no wait


def test_static_batch_too_long_together_is_refused_up_front():
    check_static_batches([(10, 10), (20, 5)], 2, 30)  # 20 + 10 fits 30
    with pytest.raises(
        ContextTooLong, match=r"pads requests 1\.\.2 to 20 prompt tokens: prompt is 20 tokens \+ max_new_tokens 12"
    ):
        check_static_batches([(10, 10), (20, 5), (3, 12)], 2, 30)


# -- lane clocks ------------------------------------------------------------------------------------
def test_a_lane_clock_counts_only_its_own_steps(monkeypatch):
    now = {"t": 100.0}
    monkeypatch.setattr(clock_mod.time, "perf_counter", lambda: now["t"])
    c = LaneClock()

    def step(cost):
        def run():
            now["t"] += cost / 2
            inside = c.now()
            now["t"] += cost / 2
            return inside

        return run

    assert c.timed(step(0.2)) == pytest.approx(0.1)  # mid-step: the step so far
    now["t"] += 5.0  # other lanes' steps: not ours
    c.timed(step(0.3))
    assert c.elapsed == pytest.approx(0.5) and c.now() == pytest.approx(0.5)
    c.skip_to(2.0)  # idle until an arrival
    c.skip_to(1.0)  # never backwards
    assert c.now() == 2.0
    fixed = LaneClock(step_cost_s=0.01)
    assert fixed.timed(lambda: fixed.now()) == 0.01 and fixed.elapsed == 0.01


def test_the_lane_furthest_behind_on_its_clock_steps_next(model):
    reqs = greedy(mixed_workload(8, seed=1, max_new=20))
    race = build_race(
        model, [(0.0, r) for r in reqs], race_run(4, 128), step_cost_s=0.01, lanes=("continuous", "chunked")
    )
    slow, fast = race.lanes
    slow.clock.step_cost_s = 0.03  # its steps cost 3x more
    order = []
    while fast.has_work() and slow.has_work():
        order.append(race.step().key)
        assert -0.01 - 1e-9 <= slow.clock.elapsed - fast.clock.elapsed <= 0.03 + 1e-9
    assert len(order) > 20
    assert order.count("chunked") == pytest.approx(3 * order.count("continuous"), abs=3)


# -- the race against the headless paths ------------------------------------------------------------
def test_race_figures_equal_run_static_and_run_continuous(model):
    reqs = greedy(mixed_workload(13, seed=5, max_new=30))
    race = build_race(
        model, [(0.0, r) for r in reqs], race_run(4, 128, max_batched_tokens=16, block_size=8), step_cost_s=0.01
    )
    run_race(race)
    static, cont, chunked = race.lanes
    headless = {
        "static": run_static(model, reqs, 4),
        "continuous": run_continuous(model, reqs, 4, max_len=128),
        "chunked": run_continuous(
            model, reqs, 4, max_len=128, kv="paged", block_size=8, chunked_prefill=True, max_batched_tokens=16
        ),
    }
    for lane in race.lanes:
        results, summary = headless[lane.key]
        r = lane.result()
        assert (r.decode_steps, r.row_util, r.useful_tokens) == (
            summary["decode_steps"],
            summary["row_util"],
            summary["useful_tokens"],
        ), lane.key
        assert r.kv_used_mean == pytest.approx(summary["kv_used_mean"]), lane.key
        assert r.prefill_tokens == summary["prefill_tokens_computed"], lane.key
        tokens = [lane.engine.results[i].tokens for i in range(len(reqs))]
        assert tokens == [x.tokens for x in results], lane.key  # greedy: the same outputs
    # one forward for every lane: only static batching computes rows it throws away (its finished ones)
    assert static.result().row_util < cont.result().row_util == chunked.result().row_util == 1.0
    assert static.result().decode_steps > cont.result().decode_steps


def test_arrivals_come_on_each_lanes_clock_and_ttft_counts_from_them(model):
    a, b, c = greedy(mixed_workload(3, seed=2, max_new=6))
    work = [(0.0, a), (0.0, b), (5.0, c)]
    race = build_race(model, work, race_run(4, 128), step_cost_s=0.01, batch_timeout_s=0.5)
    seen_note = False
    while (lane := race.step()) is not None:
        static_view = race.views()[0]  # what the screen shows meanwhile
        seen_note |= static_view.note == "waits for a full batch: 2/4, or until 0.50 s"
        if lane.key != "static":
            assert lane.view().arriving == (1 if lane.clock.elapsed < 5.0 else 0)
    for lane in race.lanes:
        r = lane.result()
        assert lane.clock.elapsed >= 5.0  # skipped to #2's arrival
        assert r.ttft_p95_s < 1.0, lane.key  # not from t=0
    static = race.lanes[0]
    # #0 and #1 waited for a full batch of 4 until the timeout (0.5 s of the static lane's clock)
    assert static.engine.first_s[0] == pytest.approx(0.51)
    assert static.engine.first_s[2] == pytest.approx(5.01)  # alone at once: nothing more to come
    assert race.lanes[1].engine.snapshot().request(0).first_token_s == pytest.approx(0.01)
    assert seen_note


def test_bad_race_settings_are_refused(model):
    r = Request([1, 2], 3)
    with pytest.raises(ValueError, match="unknown lane"):
        build_race(model, [(0.0, r)], race_run(2, 64), lanes=("static", "fastest"))
    with pytest.raises(ValueError, match="greedy"):
        build_race(model, [(0.0, Request([1], 2, eos_id=0))], race_run(2, 64))
    with pytest.raises(ContextTooLong, match="--max-len"):
        build_race(model, [(0.0, Request([1] * 60, 10))], race_run(2, 64))
    with pytest.raises(ValueError, match="the pool has only 4 blocks"):
        build_race(model, [(0.0, Request([1] * 40, 20))], race_run(2, 64, block_size=8, kv_blocks=4))


@pytest.mark.parametrize("name", sorted(bundled_workloads()))
def test_every_bundled_workload_can_be_raced_by_static_batching_on_the_bundled_model(name):
    """The race's default lanes on every shipped prompt file: static batching (16 rows) pads a
    batch to its longest prompt, so the workload must fit the bundled model's context together
    (prompts/long_tail.jsonl once had a 129-token prompt: 129 + its 384 cap > 512, and the race
    refused it)."""
    cfg, tok = load_config_and_tokenizer(default_model_dir())
    work = race_workload(bundled_workloads()[name], tok.encode, cfg.max_seq_len)
    check_static_batches([(len(w[1]), w[2]) for w in sorted(work, key=lambda w: w[0])], 16, cfg.max_seq_len)
