"""The race at equal KV memory (issue 22): ``--kv-memory`` / a lane's ``kv_mib=`` size every lane
with the engine's own arithmetic (engine/build.py, as tinyllm bench's headline table), the paged
lanes run more sequences than the slot ones at the same memory, the screen says so ("64 seqs ·
32 MiB"), and a bad budget is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import cli_refusal, race_run, random_model
from tinyllm.cli import main as tinyllm_main
from tinyllm.engine import Request, kv_bytes_per_token
from tinyllm.engine.build import MIB, blocks_for_budget, rows_for_budget
from tinyllm.engine.solo import generate
from tinyllm.race.race import build_race
from tinyllm.race.spec import LaneSpecError, check_memory_options, parse_lanes
from tinyllm.race.views import capacity

MAX_LEN, BLOCK = 64, 8
RECORDING = Path(__file__).parent / "data" / "preemption-run.jsonl"


@pytest.fixture(scope="module")
def model():
    return random_model(seed=2, vocab=256, d_model=32, n_layers=1, max_seq_len=128)


def budget_of(model, rows: int) -> float:
    """The MiB that ``rows`` rows of MAX_LEN reserve on this model."""
    return rows * MAX_LEN * kv_bytes_per_token(model, torch.device("cpu")) / MIB


def short_work(n: int = 16) -> list[tuple[float, Request]]:
    """Short requests (14 tokens: 2 blocks of 8): a slot reserves MAX_LEN for each, a paged lane 16."""
    return [(0.0, Request([1 + i] * 6, 8)) for i in range(n)]


def run(race) -> int:
    """Step to the end; the most sequences any lane ran at once, per lane."""
    most = [0] * len(race.lanes)
    while (lane := race.step()) is not None:
        i = race.lanes.index(lane)
        most[i] = max(
            most[i], sum(r.rid is not None and r.state in ("running", "prefill", "wasted") for r in lane.view().rows)
        )
    return most


def test_every_lane_gets_what_the_same_memory_buys(model):
    bpt = kv_bytes_per_token(model, torch.device("cpu"))
    mib = budget_of(model, 4)
    lanes = parse_lanes(
        [
            "static",
            "continuous",
            "chunked",
            "continuous kv=paged",
            "chunked slots=8",
            f"static kv_mib={budget_of(model, 2)}",
        ]
    )
    race = build_race(
        model, short_work(), race_run(99, MAX_LEN, block_size=BLOCK, kv_memory_mib=mib), lanes=lanes, step_cost_s=0.01
    )
    got = [(lane.seqs, lane.kv_blocks) for lane in race.lanes]
    rows, blocks = rows_for_budget(mib, MAX_LEN, bpt), blocks_for_budget(mib, MAX_LEN, BLOCK, bpt)
    assert (rows, blocks) == (4, 32)
    assert got == [(4, None), (4, None), (64, 32), (64, 32), (8, 32), (2, None)]  # slots= caps; kv_mib= overrides
    assert [round(lane.kv_mib * MIB) for lane in race.lanes[:5]] == [round(mib * MIB)] * 5
    views = race.views()
    assert views[0].capacity == capacity(4, mib) and views[2].capacity.startswith("64 seqs · ")
    assert "KV" in views[5].detail and views[5].seqs == 2
    assert race.lanes[0].engine.batch_size == 4 and race.lanes[1].engine.slots.n_slots == 4


def test_a_bfloat16_lane_gets_twice_what_the_same_memory_buys_and_says_bf16(model):
    """kv_dtype=bfloat16 (or the race's --kv-cache-dtype): half the bytes per token, so the same
    MiB buys twice the rows and blocks, every request still runs to the end, and the lane's
    capacity names the dtype (why the same MiB runs more)."""
    mib = budget_of(model, 4)
    lanes = parse_lanes(["static", "static kv_dtype=bf16", "chunked", "chunked kv_dtype=bfloat16", "continuous"])
    race = build_race(
        model, short_work(), race_run(99, MAX_LEN, block_size=BLOCK, kv_memory_mib=mib), lanes=lanes, step_cost_s=0.01
    )
    assert [(lane.seqs, lane.kv_blocks) for lane in race.lanes] == [(4, None), (8, None), (64, 32), (64, 64), (4, None)]
    assert [v.kv_dtype for v in race.views()] == ["float32", "bfloat16", "float32", "bfloat16", "float32"]
    assert race.views()[1].capacity == capacity(8, mib, "bfloat16") == f"8 seqs · {capacity(8, mib)[9:]} bf16"
    assert race.views()[0].capacity == capacity(4, mib)
    run(race)
    assert all(v.done == v.total == 16 for v in race.views())
    every = build_race(
        model,
        short_work(),
        race_run(99, MAX_LEN, block_size=BLOCK, kv_memory_mib=mib, kv_cache_dtype="bfloat16"),
        lanes=parse_lanes(["static", "chunked"]),
        step_cost_s=0.01,
    )
    assert [(lane.seqs, lane.kv_blocks, lane.kv_dtype) for lane in every.lanes] == [
        (8, None, "bfloat16"),
        (64, 64, "bfloat16"),
    ]


def test_max_num_seqs_caps_every_lane_at_a_budget(model):
    race = build_race(
        model,
        short_work(),
        race_run(99, MAX_LEN, block_size=BLOCK, kv_memory_mib=budget_of(model, 4), max_num_seqs=3),
        step_cost_s=0.01,
    )
    assert [lane.seqs for lane in race.lanes] == [3, 3, 3]


def test_the_paged_lane_runs_more_at_the_same_memory_and_makes_the_same_tokens(model):
    work = short_work()
    race = build_race(
        model, work, race_run(99, MAX_LEN, block_size=BLOCK, kv_memory_mib=budget_of(model, 4)), step_cost_s=0.01
    )
    most = run(race)
    _, slots, paged = race.views()
    assert most[:2] == [4, 4] and most[2] == 16  # 16 requests x 2 blocks = the 32 blocks
    assert paged.result.decode_steps < slots.result.decode_steps
    assert paged.result.wall_s < slots.result.wall_s
    solo = [generate(model, r.prompt, r.max_new_tokens) for _, r in work]
    for lane in race.lanes:
        assert [lane.engine.results[rid].tokens for rid in range(len(work))] == solo


@pytest.mark.parametrize(
    "lane, message",
    [
        ("kv_mib=0", "kv_mib must be a number of MiB > 0, got '0'"),
        ("kv_mib=-1", "kv_mib must be a number of MiB > 0, got '-1'"),
        ("kv_mib=nan", "kv_mib must be a number of MiB > 0, got 'nan'"),
        ("kv_mib=inf", "kv_mib must be a number of MiB > 0, got 'inf'"),
        ("kv_mib=x", "kv_mib must be a number of MiB > 0, got 'x'"),
        ("chunked kv_mib=4 blocks=8", "kv_mib sizes the KV pool: drop blocks="),
    ],
)
def test_a_bad_lane_budget_says_what_is_allowed(lane, message):
    with pytest.raises(LaneSpecError, match=message):
        parse_lanes([lane])


def test_memory_options_that_clash_are_named():
    lanes = parse_lanes(["static", "chunked blocks=8"])
    with pytest.raises(LaneSpecError, match="--kv-memory sizes every lane's KV: drop --kv-blocks"):
        check_memory_options(parse_lanes(["static", "chunked"]), 4.0, 10, None)
    with pytest.raises(LaneSpecError, match="--max-num-seqs goes with --kv-memory"):
        check_memory_options(parse_lanes(["static", "chunked"]), None, None, 8)
    with pytest.raises(LaneSpecError, match="lane 'chunked blocks=8': blocks= sizes the pool, and so does --kv-memory"):
        check_memory_options(lanes, 4.0, None, None)
    check_memory_options(parse_lanes(["static kv_mib=2", "chunked"]), None, None, 8)  # a lane's budget: fine


def test_a_budget_too_small_for_one_request_is_the_engines_message_naming_the_option(model):
    work = short_work(2)
    with pytest.raises(
        ValueError,
        match=r"lane 'static': --kv-memory 0.001 MiB is too small for one request: a row "
        r"reserves --max-len 64 tokens",
    ):
        build_race(model, work, race_run(4, MAX_LEN, kv_memory_mib=0.001))
    with pytest.raises(
        ValueError,
        match=r"lane 'chunked kv_mib=0.001': kv_mib 0.001 MiB is too small for one "
        r"request: its pool holds",
    ):
        build_race(model, work, race_run(4, MAX_LEN), lanes=parse_lanes(["static", "chunked kv_mib=0.001"]))
    for bad in (0, -1.0, float("nan"), float("inf")):  # (the run's config refuses it, as every engine's)
        with pytest.raises(ValueError, match="kv_memory_mib must be a number of MiB > 0"):
            race_run(4, MAX_LEN, kv_memory_mib=bad)
    with pytest.raises(ValueError, match="give kv_memory_mib or kv_blocks, not both"):
        race_run(4, MAX_LEN, kv_blocks=8, kv_memory_mib=1.0)


# -- tinyllm whatif ------------------------------------------------------------------------------------
def test_tinyllm_whatif_at_equal_memory_prints_each_lanes_sequences_and_memory(tmp_path, capsys):
    work, out = tmp_path / "short.jsonl", tmp_path / "w.json"
    work.write_text(
        "".join(
            f'{{"prompt": "{w}:", "max_new_tokens": 4}}\n'
            for w in ("ROMEO", "JULIET", "HAMLET", "KING", "QUEEN", "NURSE")
        )
    )
    # the bundled model: 6,144 bytes a token, so a row of 64 is 0.375 MiB and a block of 16 is 0.09375
    assert (
        tinyllm_main(
            [
                "whatif",
                str(work),
                "--lanes",
                "static",
                "continuous",
                "chunked",
                "--kv-memory",
                "0.75",
                "--step-cost",
                "0.01",
                "--json",
                str(out),
                "--max-len",
                "64",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "2 seqs · 0.75 MiB" in text and "64 seqs · 0.75 MiB" in text
    rows = {line.split()[1]: line for line in text.splitlines()[:5] if len(line.split()) > 1}  # (place, lane, ...)
    assert "64 seqs · 0.75 MiB" in rows["token"] and "2 seqs · 0.75 MiB" in rows["static"]  # on its lane's row
    doc = json.loads(out.read_text())
    assert [(lane["seqs"], lane["kv_mib"], lane["kv_blocks"], lane["kv_dtype"]) for lane in doc["lanes"]] == [
        (2, 0.75, None, "float32"),
        (2, 0.75, None, "float32"),
        (64, 0.75, 8, "float32"),
    ]
    assert doc["lanes"][2]["decode_steps"] < doc["lanes"][1]["decode_steps"]  # all 6 at once, not 2 by 2


def test_max_num_seqs_caps_the_lanes_with_a_budget_of_their_own_on_a_run_without_one(model, tmp_path, capsys):
    """--max-num-seqs beside lanes' kv_mib= (no --kv-memory): it caps those lanes' sequences, and
    the other lanes run --slots (the run's config holds one of the two: the cap travels beside it)."""
    lanes = parse_lanes(["chunked kv_mib=0.75", "continuous"])
    race = build_race(model, short_work(6), race_run(3, MAX_LEN, BLOCK), lanes=lanes, step_cost_s=0.01, lane_cap=2)
    assert [v.seqs for v in race.views()] == [2, 3]
    work = tmp_path / "short.jsonl"
    work.write_text("".join(f'{{"prompt": "{w}:", "max_new_tokens": 4}}\n' for w in ("ROMEO", "JULIET", "KING")))
    argv = ["whatif", str(work), "--lanes", "chunked kv_mib=0.75", "continuous", "--max-num-seqs", "2"]
    assert tinyllm_main([*argv, "--slots", "3", "--step-cost", "0.01", "--max-len", "64"]) == 0
    text = capsys.readouterr().out
    assert "2 seqs · 0.75 MiB" in text and "3 seqs" in text


@pytest.mark.parametrize(
    "args, message",
    [
        *[(["--kv-memory", v], f"--kv-memory: expected a finite number > 0, got {v}") for v in ("0", "nan", "-3")],
        (["--kv-memory", "0.0001"], "lane 'static': --kv-memory 0.0001 MiB is too small for one request"),
        (["--kv-memory", "2", "--kv-blocks", "9"], "--kv-memory sizes every lane's KV: drop --kv-blocks"),
        (["--max-num-seqs", "9"], "--max-num-seqs goes with --kv-memory"),
    ],
)
def test_tinyllm_whatif_refuses_a_bad_budget_in_one_line(args, message, capsys):
    err = cli_refusal(["whatif", str(RECORDING), "--lanes", "static", "chunked", *args], capsys)
    assert message in err, err


def test_a_static_lane_at_a_budget_must_fit_each_padded_row_in_max_len(model):
    """Its rows are counted as rows of max_len: a batch padded past max_len (here 40 + 40 = 80 >
    64, though within the model's 128) would use more memory than the budget, so it is refused,
    naming --max-len; without a budget the model's context is the limit, as before."""
    work = [(0.0, Request([3] * 40, 8)), (0.0, Request([4] * 8, 40))]  # each alone fits 64
    build_race(model, work, race_run(2, MAX_LEN, block_size=BLOCK), lanes=("static",))
    with pytest.raises(
        ValueError,
        match=r"lane 'static': static batching pads requests 0\.\.1 to 40 prompt tokens: "
        r".*more than --max-len \(the row a KV budget reserves\)",
    ):
        build_race(
            model, work, race_run(2, MAX_LEN, block_size=BLOCK, kv_memory_mib=budget_of(model, 2)), lanes=("static",)
        )
