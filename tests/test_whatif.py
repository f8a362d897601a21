"""What-if (issue 23): lanes with their own settings, a recording's requests replayed at their
recorded arrival times in each, compared request by request; ``tinyllm whatif`` in the terminal
and as JSON; the bundled workload where the policy visibly changes who waits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import race_run, random_model
from tinyllm.cli import main as tinyllm_main
from tinyllm.engine import Request
from tinyllm.engine.solo import generate
from tinyllm.race.race import build_race
from tinyllm.race.spec import LaneSpec, LaneSpecError, on_recording, parse_lanes
from tinyllm.race.whatif import compare, load_arrivals, recorded_settings, requests_from_recording, to_json
from tinyllm.workload import resolve_workload

RECORDING = Path(__file__).parent / "data" / "preemption-run.jsonl"


def test_lanes_parse_from_policies_kinds_and_settings():
    lanes = parse_lanes(
        ["fcfs", "priority", "fair budget=64,blocks=40", "static slots=4", "continuous kv=paged block=8"]
    )
    assert lanes[0] == LaneSpec("fcfs", "chunked", "fcfs")
    assert lanes[1].policy == "priority" and lanes[1].kind == "chunked"
    assert (lanes[2].label, lanes[2].policy, lanes[2].budget, lanes[2].kv_blocks) == (
        "fair budget=64 blocks=40",
        "fair",
        64,
        40,
    )
    assert lanes[3].kind == "static" and lanes[3].slots == 4
    assert (lanes[4].kind, lanes[4].kv, lanes[4].block_size) == ("continuous", "paged", 8)
    assert [s.kind for s in parse_lanes(["static,chunked"])] == ["static", "chunked"]  # the old form
    assert [s.kind for s in parse_lanes(None)] == ["static", "continuous", "chunked"]


@pytest.mark.parametrize(
    "lanes, message",
    [
        (["lifo"], "'lifo' is neither a lane kind (static, continuous, chunked) nor a policy"),
        (["budget=0"], "budget must be an integer >= 1, got '0'"),
        (["policy=lottery"], "policy must be one of fcfs, priority, shortest-first, fair, got 'lottery'"),
        (["prefix=maybe"], "prefix must be on or off, got 'maybe'"),
        (["colour=red"], "unknown setting 'colour'"),
        (["static budget=8"], "static batching takes only slots="),
        (["continuous budget=8"], "budget, prefix and spec need chunked prefill"),
        (["fcfs", "fcfs"], "two lanes are both 'fcfs'"),
        ([""], "an empty lane"),
        (["fcfs"], "a race needs at least two lanes, got 1"),
    ],
)
def test_a_bad_lane_says_which_lane_and_what_is_allowed(lanes, message):
    with pytest.raises(LaneSpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_lanes(lanes)


def test_a_recordings_requests_come_back_at_their_recorded_times():
    arrivals, warning = requests_from_recording(RECORDING)
    assert warning is None and arrivals
    assert [t for t, _ in arrivals] == sorted(t for t, _ in arrivals)
    assert all(isinstance(r, Request) and r.max_new_tokens >= 1 and r.eos_id is None for _, r in arrivals)


@pytest.fixture(scope="module")
def model():
    return random_model(seed=2, vocab=256, d_model=32, n_layers=1, max_seq_len=256)


def test_three_lanes_on_the_same_arrivals_make_the_same_tokens_and_compare_per_request(model):
    arrivals = [
        (0.02 * i, Request([1 + i] * (5 + 7 * (i % 4)), 6 + 5 * (i % 3), priority=i % 2, tenant="ab"[i % 2]))
        for i in range(12)
    ]
    lanes = parse_lanes(["fcfs", "priority", "fair budget=16 blocks=7 block=8"])
    race = build_race(model, arrivals, race_run(3, 128, block_size=8), lanes=lanes, step_cost_s=0.01)
    while race.step() is not None:
        pass
    views = race.views()
    assert all(v.finished for v in views)
    assert [v.title for v in views] == ["fcfs", "priority", "fair budget=16 blocks=7 block=8"]
    for lane in race.lanes:  # greedy: every lane makes the solo tokens
        for rid, (_, r) in enumerate(arrivals):
            assert lane.engine.results[rid].tokens == generate(model, r.prompt, r.max_new_tokens)
    rows = compare(views)
    assert sorted(r.rid for r in rows) == list(range(12))
    assert all(all(o is not None for o in r.outcomes) for r in rows)
    changes = [abs(r.change) for r in rows]
    assert changes == sorted(changes, reverse=True)  # the most changed first
    for r in rows:
        base, *others = r.outcomes
        assert r.change == pytest.approx(max((o.e2e_s / base.e2e_s - 1 for o in others), key=abs))
    tight = views[2]
    assert sum(o.preemptions for o in tight.outcomes) == race.lanes[2].engine.stats.preemptions > 0
    assert any(dict(o.waited).get("pool") for o in tight.outcomes)  # the small pool made some wait
    doc = to_json(views, rows, "test")
    assert doc["group_by"] == "tenant" and set(doc["lanes"][0]["groups"]) == {"a", "b"}
    assert all(set(req["lanes"]) == {v.title for v in views} for req in doc["requests"])


def test_priority_serves_the_interactive_tenant_first_on_the_bundled_workload():
    """batch_and_chat (its first 6 batch and 6 chat requests, shortened, on 4 slots): long batch
    requests at t=0, short chat ones arriving meanwhile at priority 0. On a fixed-cost clock
    (exact): chat TTFT p95 under priority is far below fcfs, and fair is not worse than fcfs."""
    from tinyllm.model.checkpoint import load_checkpoint

    model, tok = load_checkpoint()
    arrivals, _ = load_arrivals("batch_and_chat", tok.encode, 512, 64)
    batch = [(t, r) for t, r in arrivals if r.tenant == "batch"][:6]
    chat = [(t, r) for t, r in arrivals if r.tenant == "chat"][:6]
    arrivals = [
        (t, Request(r.prompt, 24 if r.tenant == "batch" else 6, priority=r.priority, tenant=r.tenant))
        for t, r in batch + chat
    ]
    race = build_race(
        model, arrivals, race_run(4, 512), lanes=parse_lanes(["fcfs", "priority", "fair"]), step_cost_s=0.02
    )
    while race.step() is not None:
        pass
    doc = to_json(race.views(), compare(race.views()), "batch_and_chat")
    chat = {lane["name"]: lane["groups"]["chat"] for lane in doc["lanes"]}
    assert chat["priority"]["ttft_p95_s"] < 0.5 * chat["fcfs"]["ttft_p95_s"]
    assert chat["fair"]["ttft_p95_s"] <= chat["fcfs"]["ttft_p95_s"]


def whatif(source, lanes: list[str], out: Path, *options: str) -> int:
    """``tinyllm whatif`` on ``source``'s requests, 0.01 s a step, its JSON written to ``out``."""
    return tinyllm_main(["whatif", str(source), "--lanes", *lanes, "--step-cost", "0.01", "--json", str(out), *options])


def test_tinyllm_whatif_prints_the_comparison_and_writes_json(tmp_path, capsys):
    out = tmp_path / "w.json"
    assert whatif(RECORDING, ["fcfs", "shortest-first", "budget=32 blocks=24"], out, "--max-len", "256") == 0
    text = capsys.readouterr().out
    assert "per request, most changed first" in text and "A = fcfs" in text and "C = budget=32 blocks=24" in text
    assert ("A waited" in text) == ("waited: the reason" in text)  # the legend explains only columns shown
    doc = json.loads(out.read_text())
    assert [lane["name"] for lane in doc["lanes"]] == ["fcfs", "shortest-first", "budget=32 blocks=24"]
    assert len(doc["requests"]) == len(requests_from_recording(RECORDING)[0])
    assert len({lane["useful_tokens"] for lane in doc["lanes"]}) == 1  # the same work in every lane


@pytest.mark.parametrize(
    "args, message",
    [
        (["--lanes", "lifo"], "--lanes: lane 'lifo'"),
        (["--lanes", "fcfs", "budget=x"], "budget must be an integer >= 1"),
        (["--lanes", "fcfs"], "--lanes: a race needs at least two lanes, got 1"),  # as tinyllm-tui --race says
        (
            ["--lanes", "fcfs", "priority", "--slots", "4", "--kv-memory", "8"],
            "--slots is the number of sequences without",
        ),
    ],
)
def test_tinyllm_whatif_refuses_a_bad_lane_in_one_line(args, message, capsys):
    assert tinyllm_main(["whatif", str(RECORDING), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_workload_lines_n_samples_are_n_requests_in_whatif_and_the_race(tmp_path, capsys):
    """{"n": 4} ran as one request in the race and whatif: 2 requests and 50 tokens, not 5 and 110."""
    from tinyllm.model.checkpoint import load_checkpoint
    from tinyllm.race.whatif import load_arrivals
    from tui.runners.race import race_workload

    wl = tmp_path / "n.jsonl"
    wl.write_text(
        '{"prompt": "ROMEO:\\n", "max_new_tokens": 20, "n": 4}\n{"prompt": "JULIET:", "max_new_tokens": 30}\n'
    )
    _, tok = load_checkpoint(None)
    arrivals, _ = load_arrivals(str(wl), tok.encode, 256, 64)
    assert [r.max_new_tokens for _, r in arrivals] == [20, 20, 20, 20, 30]
    assert [w[2] for w in race_workload(wl, tok.encode, 256)] == [20, 20, 20, 20, 30]
    out = tmp_path / "w.json"
    assert whatif(wl, ["static", "chunked"], out) == 0
    assert {lane["useful_tokens"] for lane in json.loads(out.read_text())["lanes"]} == {110}


def test_whatif_with_arrivals_says_tok_s_is_the_arrival_rate_and_shows_each_lanes_compute(tmp_path, capsys):
    """Over arrivals every lane's clock runs to about the last one: tok/s was the same in every lane
    and the JSON said the clocks were compute only. The table says why and adds busy (compute)."""
    out = tmp_path / "w.json"
    wl = tmp_path / "arrivals.jsonl"  # five short requests, a second apart: idle gaps on every clock
    wl.write_text("".join(f'{{"prompt": "ROMEO:", "max_new_tokens": 6, "arrival_s": {i}}}\n' for i in range(5)))
    assert whatif(wl, ["static", "chunked"], out) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "requests arrived over time, so every lane's tok/s is about the rate they came at: compare latency; "
        "busy = compute" in text
    )
    doc = json.loads(out.read_text())
    assert all(0 < lane["busy_s"] < lane["wall_s"] for lane in doc["lanes"])
    assert "busy_s leaves them out" in doc["clock_dependent"]


def test_static_batchings_queue_is_its_reason_to_wait_in_the_table_and_the_json(tmp_path, capsys):
    """Static batching's requests that waited for the batch ahead showed "—" under waited and
    {} in the JSON's waited_steps while their verdict said "queue": the lane counts the steps
    each sat in its queue, and a request whose batch started on its arrival waited for nothing."""
    out = tmp_path / "w.json"
    wl = tmp_path / "four.jsonl"  # four at once, batches of two: the second batch waits for the first
    wl.write_text("".join('{"prompt": "ROMEO:", "max_new_tokens": 6}\n' for _ in range(4)))
    assert whatif(wl, ["static slots=2", "continuous slots=4"], out) == 0
    capsys.readouterr()
    doc = json.loads(out.read_text())
    static = doc["lanes"][0]["name"]
    waited = {r["rid"]: r["lanes"][static]["waited_steps"] for r in doc["requests"]}
    assert waited[0] == waited[1] == {}  # the first batch started at once
    assert waited[2] == waited[3] == {"queue": 6}, waited  # behind the first batch's 6 passes


def test_tinyllm_whatif_refuses_pool_options_no_lane_uses(capsys):
    """On a workload, static and slot-KV lanes have no blocks: --kv-blocks was ignored. (On this
    recording, made on --kv paged, a continuous lane takes the recorded paged KV, and uses it.)"""
    assert tinyllm_main(["whatif", "burst", "--lanes", "static", "continuous", "--kv-blocks", "64"]) == 2
    err = capsys.readouterr().err
    assert "--kv-blocks sizes the paged lanes' KV pool, and no lane here is paged ('static', 'continuous':" in err
    assert len(err.strip().splitlines()) == 1


def test_tinyllm_whatif_refuses_a_missing_source(capsys):
    assert tinyllm_main(["whatif", "no-such-run.jsonl", "--lanes", "fcfs", "priority"]) == 2
    assert "no such file, and not a bundled workload" in capsys.readouterr().err


def test_the_bundled_policy_workload_is_shipped():
    assert resolve_workload("batch_and_chat").is_file()


def test_tinyllm_whatif_refuses_a_broken_recording_in_one_line(tmp_path, capsys):
    header = RECORDING.read_text(encoding="utf-8").splitlines()[0]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(header + '\n{"step": 1, "snap": {"r": {"0": {"prompt": [1, 2]}}}}\n', encoding="utf-8")
    assert tinyllm_main(["whatif", str(bad), "--lanes", "fcfs", "priority"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: not a snapshot delta" in err and "Traceback" not in err


def test_a_recordings_arrivals_start_at_zero():
    arrivals, _ = requests_from_recording(RECORDING)
    assert min(t for t, _ in arrivals) == 0.0


def test_max_new_tokens_that_no_request_takes_is_said_to_be_unused(tmp_path):
    """--max-new-tokens fills workload lines without their own max_new_tokens; given where every
    request has its own (a new user read it as a cap), the command says it is unused."""
    enc = lambda text: [ord(c) % 200 + 1 for c in text]  # noqa: E731  (no tokenizer needed)
    own, mixed = tmp_path / "own.jsonl", tmp_path / "mixed.jsonl"
    own.write_text('{"prompt": "a", "max_new_tokens": 5}\n{"prompt": "b", "max_new_tokens": 7}\n')
    mixed.write_text('{"prompt": "a", "max_new_tokens": 5}\n{"prompt": "b"}\n')
    arrivals, warning = load_arrivals(str(own), enc, 64, 16)
    assert [r.max_new_tokens for _, r in arrivals] == [5, 7]
    assert warning == (
        "--max-new-tokens 16 is unused: every request of own.jsonl sets its own (it fills only "
        "workload lines without max_new_tokens)"
    )
    assert load_arrivals(str(own), enc, 64)[1] is None  # not asked: nothing to say
    arrivals, warning = load_arrivals(str(mixed), enc, 64, 16)
    assert [r.max_new_tokens for _, r in arrivals] == [5, 16] and warning is None
    recording = Path(__file__).parent / "data" / "preemption-run.jsonl"
    assert "--max-new-tokens 16 is unused" in load_arrivals(str(recording), enc, 512, 16)[1]


def recorded_preemptions(path: Path) -> int:
    return sum(
        ev[0] == "preempted"
        for line in path.read_text(encoding="utf-8").splitlines()[1:]
        for ev in json.loads(line).get("life", [])
    )


def test_a_lane_on_a_recording_starts_from_the_recorded_engine_and_changes_only_its_own_settings():
    """The fixture: 3 slots, paged, 16 blocks of 16, token budget 32, prefix cache; written before
    headers said the policy and KV dtype, so a lane that takes them is told the default it gets."""
    rec = recorded_settings(RECORDING)
    assert rec.max_len == 256 and rec.kind == "chunked"
    lanes, notes = on_recording(
        parse_lanes(
            [
                "fcfs",
                "fcfs blocks=24",
                "continuous",
                "static",
                "continuous kv=slots",
                "chunked kv_mib=2",
                "priority slots=2",
            ]
        ),
        rec,
    )
    fcfs, bigger, cont, static, slot_kv, sized, prio = lanes
    assert (fcfs.kind, fcfs.slots, fcfs.block_size, fcfs.kv_blocks, fcfs.budget, fcfs.prefix_cache) == (
        "chunked",
        3,
        16,
        16,
        32,
        True,
    )
    assert "as recorded: token budget, budget 32, slots 3, block 16, blocks 16, prefix cache on" in fcfs.describe()
    assert bigger.kv_blocks == 24 and bigger.slots == 3 and "blocks" not in bigger.recorded
    assert bigger.describe().startswith("blocks 24; as recorded:")
    assert (cont.kind, cont.kv, cont.kv_blocks, cont.budget) == ("continuous", "paged", 16, None)
    assert (static.kind, static.slots) == ("static", 3)
    assert (slot_kv.kind, slot_kv.kv, slot_kv.kv_blocks, slot_kv.slots) == ("continuous", "slots", None, 3)
    assert (sized.kv_mib, sized.slots, sized.kv_blocks) == (2.0, None, None)  # its budget sizes it
    assert (prio.policy, prio.slots, prio.kv_blocks) == ("priority", 2, 16)
    assert notes == [
        ("the recording does not say its KV cache dtype: lanes that do not set it use --kv-cache-dtype auto"),
        "the recording does not say its scheduling policy: lanes that do not set it use fcfs",
    ]
    assert recorded_settings(resolve_workload("batch_and_chat")) is None  # a workload: no settings


def test_tinyllm_whatif_lane_a_is_the_recorded_run_and_options_win_over_the_recording(tmp_path, capsys):
    """Lane ``fcfs`` makes the recording's preemptions at its pool; ``blocks=`` changes only the
    pool; an option (--kv-blocks) sets every lane that does not set its own."""
    out = tmp_path / "w.json"
    assert whatif(RECORDING, ["fcfs", "fcfs blocks=64"], out) == 0
    text = capsys.readouterr().out
    assert text.startswith(
        "as recorded, unless a lane or an option says otherwise: token budget, budget 32, "
        "slots 3, block 16, blocks 16, kv paged, prefix cache on, max_len 256"
    )
    recorded, bigger = json.loads(out.read_text())["lanes"]
    assert (recorded["kv_blocks"], recorded["seqs"], bigger["kv_blocks"], bigger["seqs"]) == (16, 3, 64, 3)
    preempted = [
        sum(r["lanes"][name]["preemptions"] for r in json.loads(out.read_text())["requests"])
        for name in ("fcfs", "fcfs blocks=64")
    ]
    assert preempted[0] == recorded_preemptions(RECORDING) > preempted[1]
    assert whatif(RECORDING, ["fcfs", "fcfs blocks=64"], out, "--kv-blocks", "40") == 0
    assert [lane["kv_blocks"] for lane in json.loads(out.read_text())["lanes"]] == [40, 64]


def test_a_lane_naming_no_kind_takes_the_recorded_scheduler_unless_its_settings_need_chunked_prefill():
    from tinyllm.race.whatif import settings_from_header

    header = {
        "engine": {
            "n_slots": 4,
            "max_len": 128,
            "max_batched_tokens": None,
            "policy": "priority",
            "kv": {
                "kind": "slots",
                "reserved_tokens": 512,
                "bytes_per_token": 8,
                "block_size": 16,
                "n_blocks": None,
                "cached_flags": False,
                "dtype": "bfloat16",
            },
        }
    }
    lanes, notes = on_recording(parse_lanes(["fcfs", "budget=8", "blocks=20"]), settings_from_header(header))
    assert notes == []
    assert [(s.kind, s.kv, s.policy, s.slots, s.kv_dtype, s.kv_blocks) for s in lanes] == [
        ("continuous", "slots", "fcfs", 4, "bfloat16", None),
        ("chunked", None, "priority", 4, "bfloat16", None),
        ("continuous", "paged", "priority", 4, "bfloat16", 20),
    ]
    assert "as recorded: continuous batching, policy priority" in lanes[2].describe()


def test_a_recording_without_requests_is_refused_in_one_line(tmp_path, capsys):
    """Recorded and quit at once (or a server's stream cut before any request): whatif and the
    race say so (the race crashed on max() of nothing, whatif printed that as its error)."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text(Path(RECORDING).read_text().splitlines()[0] + "\n")  # its header only
    assert tinyllm_main(["whatif", str(empty), "--lanes", "fcfs", "priority"]) == 2
    assert "the recording holds no requests" in capsys.readouterr().err
    from tui.cli import build_parser, parse, race_spec

    parser = build_parser()
    with pytest.raises(SystemExit) as e:
        race_spec(parser, parse(parser, ["--race", str(empty), "--lanes", "fcfs", "priority"]))
    assert e.value.code == 2 and "the recording holds no requests" in capsys.readouterr().err


def test_whatif_lanes_run_on_a_stand_in_and_give_the_real_models_figures(tmp_path, capsys, monkeypatch):
    """Greedy lanes that ignore end-of-text make exactly their max_new_tokens whatever the weights,
    so on the cost clock a one-layer stand-in (pools sized at the real model's bytes per token)
    gives the real model's figures, exactly, several times faster; a speculating lane needs the
    real model (its drafts follow the text), and whatif says so."""
    import tinyllm.race.whatif_command as whatif_command

    lines = [{"prompt": "ROMEO:\n" * (1 + i % 4), "max_new_tokens": 6 + 3 * i, "arrival_s": 0.02 * i} for i in range(8)]
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps(x) + "\n" for x in lines))
    args = ["whatif", str(wl), "--lanes", "static", "continuous", "chunked", "--kv-memory", "1", "--max-len", "128"]
    assert tinyllm_main([*args, "--json", str(tmp_path / "stand-in.json")]) == 0
    with monkeypatch.context() as m:
        m.setattr(whatif_command, "lanes_model", lambda model, clock, lanes: (model, None, ""))
        assert tinyllm_main([*args, "--json", str(tmp_path / "real.json")]) == 0
    stand_in, real = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("stand-in", "real"))
    assert (stand_in.pop("stand_in"), real.pop("stand_in")) == (True, False)
    assert stand_in == real
    assert "lanes run on a one-layer stand-in model" in capsys.readouterr().out
    assert tinyllm_main(["whatif", str(wl), "--lanes", "chunked", "chunked spec=2", "--max-len", "128"]) == 0
    assert (
        "lane(s) chunked spec=2 run on the real model: a draft's acceptance follows its text" in capsys.readouterr().err
    )
