"""tinyllm tune: its errors, answers known by construction, and the same answer twice."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from tests.helpers import random_model
from tinyllm.cli import main as tinyllm_main
from tinyllm.engine import Request, kv_bytes_per_token
from tinyllm.race.cost import CostModel
from tinyllm.race.verdicts import Judging
from tinyllm.slo import SLO
from tinyllm.tune.evaluate import MIB, Bench, Evaluator, run_point, stand_in
from tinyllm.tune.search import pareto_front, search
from tinyllm.tune.space import Point, SearchError, parse_search, points

CLOCK = CostModel(0.0015, 2e-05, 4e-05, 5e-09, source="test")


@pytest.mark.parametrize(
    "args, message",
    [
        (["poisson_arrivals", "--slo", "ttft=1s", "--search", "max_seqs=1,2"], "unknown setting 'max_seqs'; settings:"),
        (["poisson_arrivals", "--slo", "ttft=1s", "--search", "max_num_seqs="], "an empty range"),
        (["poisson_arrivals", "--slo", "ttft=1s", "--search", "max_num_seqs=8..4"], "an empty range"),
        (["poisson_arrivals", "--slo", "ttft=1s", "--search", "scheduling_policy=lifo"], "choose from fcfs"),
        (["poisson_arrivals", "--slo", "ttft=500"], "give a unit, ms or s"),
        (["no-such-run.jsonl", "--slo", "ttft=1s"], "not a bundled workload (bundled:"),
        (["poisson_arrivals"], "--objective goodput needs an SLO"),
    ],
)
def test_bad_input_is_one_line_naming_what_is_allowed(args, message, capsys):
    try:
        code = tinyllm_main(["tune", *args])
    except SystemExit as e:  # (argparse's own errors: --slo)
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_search_values_parse_and_points_collapse_what_they_cannot_use():
    space = parse_search(["max-num-seqs=2..8", "enable_chunked_prefill=on,off", "max_num_batched_tokens=4,64"])
    assert space["max_num_seqs"] == (2, 4, 8) and space["chunked_prefill"] == (True, False)
    grid = points(space, Point())
    # without chunked prefill the budget does not apply: 3 seqs x 1, not x 2; budget 4 < 8 seqs is left out
    assert len([p for p in grid if not p.chunked_prefill]) == 3
    assert Point(max_num_seqs=8, max_batched_tokens=4) not in grid
    with pytest.raises(SearchError, match="given twice"):
        parse_search(["block_size=8", "block-size=16"])


@pytest.fixture(scope="module")
def model():
    return random_model(max_seq_len=128)


def bench(model, arrivals, slo: SLO, blocks: int, max_len: int = 64) -> Bench:
    bpt = {d: kv_bytes_per_token(model, next(model.parameters()).device, d) for d in ("auto", "float32", "bfloat16")}
    mib = blocks * 16 * bpt["auto"] / MIB
    own = Judging(slo, own=(None,) * len(arrivals))
    return Bench(stand_in(model), arrivals, own, CLOCK, max_len, mib, bpt)


def test_a_pool_too_small_for_many_sequences_wants_a_small_cap(model):
    """8 blocks of 16 hold two requests of 64 tokens: a cap above 2 admits more than the pool
    can grow, and they preempt each other (a preempted request's TPOT doubles); a cap of 2 never
    preempts and meets the 2 ms TPOT target (a step of 2 rows costs ~1.6 ms); a cap of 1 meets it
    too, in twice the time. (With a looser target, 3 ms, the cap of 4 wins despite its
    preemptions: more rows share each pass's fixed cost.)"""
    rng = random.Random(1)
    arrivals = [(0.0, Request([rng.randrange(1, 256) for _ in range(8)], 56)) for _ in range(8)]
    b = bench(model, arrivals, SLO(tpot_s=0.002), blocks=8)
    grid = points(parse_search(["max_num_seqs=1,2,4,8", "max_batched_tokens=64"]), Point(max_num_seqs=8))
    result = search(grid, Point(max_num_seqs=8), Evaluator(b), len(arrivals), "goodput")
    winner = result.final[0]
    assert winner.point.max_num_seqs == 2, [(o.point.max_num_seqs, o.goodput) for o in result.final]
    assert winner.preemptions == 0 and result.defaults.preemptions > 0
    assert winner.goodput > result.defaults.goodput
    assert pareto_front(result.final)[-1].goodput == winner.goodput


def test_a_long_shared_prefix_needs_the_prefix_cache(model):
    """Requests sharing a 96-token prefix, arriving one every 20 ms: with the prefix cache each
    computes its few own tokens, without it each computes all 100 and TTFT misses."""
    rng = random.Random(2)
    shared = [rng.randrange(1, 256) for _ in range(96)]
    arrivals = [(i * 0.02, Request(shared + [rng.randrange(1, 256) for _ in range(4)], 4)) for i in range(10)]
    b = bench(model, arrivals, SLO(ttft_s=0.006), blocks=64, max_len=128)
    grid = points(parse_search(["prefix_cache=off,on", "max_batched_tokens=32,128"]), Point())
    result = search(grid, Point(prefix_cache=False), Evaluator(b), len(arrivals), "goodput")
    assert result.final[0].point.prefix_cache is True and result.final[0].prefix_hits > 0
    assert result.final[0].goodput > max(o.goodput for o in result.final if not o.point.prefix_cache)


def test_the_stand_in_makes_the_same_schedule_as_the_real_model(model):
    rng = random.Random(3)
    arrivals = [(i * 0.003, Request([rng.randrange(1, 256) for _ in range(rng.randint(4, 40))], 20)) for i in range(8)]
    b = bench(model, arrivals, SLO(ttft_s=0.01), blocks=12)
    real = Bench(model, b.arrivals, b.judging, b.clock, b.max_len, b.kv_mib, b.bytes_per_token)
    for p in (Point(max_num_seqs=4, max_batched_tokens=16), Point(chunked_prefill=False, prefix_cache=False)):
        assert run_point(p, b, 8) == run_point(p, real, 8)


def test_tinyllm_tune_gives_the_same_json_twice(tmp_path, capsys):
    rng = random.Random(4)
    lines = [
        {"prompt": "ROMEO:\n" * rng.randint(1, 6), "max_new_tokens": rng.randint(4, 24), "arrival_s": i * 0.05}
        for i in range(10)
    ]
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps(x) + "\n" for x in lines))
    args = ["tune", str(wl), "--slo", "ttft=60ms,tpot=20ms", "--kv-memory", "2", "--max-len", "64", "--no-confirm"]
    args += ["--search", "max_num_seqs=1,2,4", "max_batched_tokens=16,32,64", "scheduling_policy=fcfs,shortest-first"]
    outs = []
    for i in range(2):
        assert tinyllm_main([*args, "--json", str(tmp_path / f"{i}.json")]) == 0
        report = json.loads((tmp_path / f"{i}.json").read_text())
        report.pop("measured")
        outs.append(report)
    assert outs[0] == outs[1]
    assert outs[0]["method"] == "successive halving" and outs[0]["configurations"] == 18
    text = capsys.readouterr().out
    assert "best settings for goodput" in text and "vllm serve MODEL --max-num-seqs" in text
    assert "What transfers to another machine" in text


def test_tinyllm_tune_checks_the_winner_against_the_defaults_on_the_wall_clock(tmp_path, capsys):
    lines = [{"prompt": "ROMEO:\n" * 2, "max_new_tokens": 48, "arrival_s": i * 0.001} for i in range(6)]
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps(x) + "\n" for x in lines))
    args = ["tune", str(wl), "--slo", "tpot=2ms", "--kv-memory", "0.75", "--max-len", "64", "--confirm-requests", "4"]
    assert tinyllm_main([*args, "--search", "max_num_seqs=2,64", "--json", str(tmp_path / "out.json")]) == 0
    check = json.loads((tmp_path / "out.json").read_text())["measured"]["wall_check"]
    assert check["requests"] == 4 and check["cost_clock_winner"]["requests"] == 4
    assert "wall-clock check on the first 4 requests" in capsys.readouterr().out


def test_the_winner_as_command_lines_the_server_parses_and_vllm_flags_with_notes():
    import shlex

    from tinyllm.cli import build_parser
    from tinyllm.tune.commands import serve_command, vllm_command

    p = Point(max_num_seqs=4, max_batched_tokens=128, prefix_cache=False, scheduling_policy="shortest-first")
    serve = serve_command(replace(p, kv_cache_dtype="bfloat16"), 4.0, 256, None)
    args = build_parser().parse_args(shlex.split(serve)[1:])  # every flag is tinyllm serve's
    assert (args.max_num_seqs, args.max_batched_tokens, args.prefix_cache) == (4, 128, False)
    assert (args.scheduling_policy, args.kv_cache_dtype, args.kv_memory) == ("shortest-first", "bfloat16", 4.0)
    vllm, notes = vllm_command(replace(p, chunked_prefill=False))
    assert "--no-enable-chunked-prefill" in vllm and "--scheduling-policy" not in vllm
    assert any("no shortest-first policy" in n for n in notes)


def test_when_nothing_meets_the_slo_tune_says_so_and_names_no_winner(tmp_path, capsys):
    """0/30 everywhere still named a winner that 'ties the defaults on goodput (0 req/s)', said
    'the ranking holds' and printed its command lines."""
    lines = [{"prompt": "ROMEO:\n" * 3, "max_new_tokens": 12, "arrival_s": i * 0.01} for i in range(6)]
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps(x) + "\n" for x in lines))
    args = ["tune", str(wl), "--slo", "ttft=0.001ms", "--kv-memory", "2", "--max-len", "64", "--no-confirm"]
    assert tinyllm_main([*args, "--search", "max_num_seqs=1,4", "--json", str(tmp_path / "out.json")]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "nothing meets the SLO here" in text and "so there is no winner" in text and "closest: " in text
    assert "winner: " not in text and "as command lines" not in text and "ties the defaults" not in text
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["nothing_meets_slo"] is True
    ranked = [o["latency_p95_s"] for o in report["ranking"] if not o["error"]]
    assert ranked == sorted(ranked)  # by how close each came


def test_tune_searches_speculation_on_the_real_model_and_says_it_as_a_flag(tmp_path, capsys):
    """--search num_speculative_tokens=0,4: the speculating point runs on the real model (the
    stand-in's text would make its acceptance meaningless), keeps drafts, and the answer's
    command lines carry vLLM's --speculative-config, which tinyllm serve parses."""
    import shlex

    from tinyllm.cli import build_parser
    from tinyllm.model.checkpoint import load_checkpoint
    from tinyllm.tune.commands import serve_command, vllm_command

    assert parse_search(["spec=0,2,4"]) == {"num_speculative_tokens": (0, 2, 4)}
    with pytest.raises(SearchError, match=r"'-1' is not an integer from 0 \(off\) to 16"):
        parse_search(["num_speculative_tokens=-1"])
    assert Point(chunked_prefill=False, num_speculative_tokens=4).canonical().num_speculative_tokens == 0
    real, tok = load_checkpoint()
    text = "ROMEO:\nBut soft, what light through yonder window breaks? It is the east.\n" * 2
    arrivals = [(0.0, Request(tok.encode(text), 24)), (0.0, Request(tok.encode(text), 24))]
    b = replace(bench(real, arrivals, SLO(ttft_s=1.0), blocks=40, max_len=128), real_model=real)
    only_real, only_stand_in = replace(b, model=real, real_model=None), replace(b, real_model=None)
    spec, plain = Point(max_num_seqs=2, num_speculative_tokens=4), Point(max_num_seqs=2)
    on = run_point(spec, b, 2)
    assert not on.error and on.judged == 2
    assert on == run_point(spec, only_real, 2) != run_point(spec, only_stand_in, 2)  # the real model's drafts
    assert run_point(plain, b, 2) == run_point(plain, only_stand_in, 2)  # the rest: the stand-in
    p = Point(max_num_seqs=2, num_speculative_tokens=4)
    args = build_parser().parse_args(shlex.split(serve_command(p, 4.0, 256, None))[1:])
    assert args.speculative_config["num_speculative_tokens"] == 4
    vllm = vllm_command(p)[0]  # the lookup sizes tuned with, spelled out (vLLM's defaults are 5 and 5)
    assert (
        '"prompt_lookup_max": 3' in vllm and '"prompt_lookup_min": 1' in vllm and '"disable_by_batch_size": 4' in vllm
    )
    with pytest.raises(SearchError, match=r"'17' is not an integer from 0 \(off\) to 16"):
        parse_search(["spec=0,17"])
