"""The engine's command-line options are defined once (tinyllm/engine_args.py) and mean the same in
every command: the same flag, help and default in tinyllm-tui, serve, whatif, bench, tune and train
(a command's own default said in its help); EngineConfig reads them; argparse's prefix matching is
off (``--slo`` is not ``--slots``)."""

import argparse
import subprocess
import sys

import pytest

from tinyllm.cli import build_parser as tinyllm_parser
from tinyllm.config import DEFAULT_BLOCK_SIZE, DEFAULT_SLOTS, EngineConfig
from tinyllm.engine_args import engine_options
from tui.cli import build_parser as app_parser


def actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions}


def commands() -> dict[str, argparse.ArgumentParser]:
    sub = tinyllm_parser().parse_args(["info"]).commands
    return {"tinyllm-tui": app_parser(), **{name: sub[name] for name in ("serve", "whatif", "bench", "tune", "train")}}


# A command whose default differs says so with set_defaults, and --help shows it: the app's engine
# process and tune's calibration run one thread (beside a busy core a second one waits for it).
OWN_DEFAULTS = {("tinyllm-tui", "threads"): 1, ("tune", "threads"): 1}
# The flags a command uses for something of its own: the bench's --slots sizes its tables (default
# 16), its --kv picks the paths it runs, and it is greedy: its --seed draws its workloads; train's
# --seed draws the initial weights and batches.
OWN_MEANING = {("bench", "slots"), ("bench", "kv"), ("bench", "seed"), ("train", "seed")}


def test_every_command_takes_an_engine_option_as_it_is_defined_once():
    defined = engine_options()
    seen = {name: 0 for name in defined}
    for command, parser in commands().items():
        acts = actions(parser)
        for name, (flags, kwargs) in defined.items():
            if name not in acts or (command, name) in OWN_MEANING:
                continue
            seen[name] += 1
            act = acts[name]
            assert act.option_strings[0] == flags[0], (command, name)
            want = OWN_DEFAULTS.get((command, name), kwargs.get("default"))
            assert act.help == kwargs["help"] and act.default == want, (command, name)
    assert seen["max_num_seqs"] == seen["kv_cache_dtype"] == 4 and seen["kv_memory"] == 5
    assert seen["slots"] == seen["block_size"] == 3 and seen["max_len"] == 4
    assert seen["device"] == 5 and seen["threads"] == 6  # (train: no engine, no device; its threads)
    assert seen["seed"] == 2  # (the app and serve; and generate, which is not an engine)


def test_the_app_fills_the_configs_defaults_and_builds_the_config_it_was_given():
    from tui.cli import parse

    a = parse(app_parser(), [])
    assert (a.slots, a.block_size) == (DEFAULT_SLOTS, DEFAULT_BLOCK_SIZE) and "slots" not in a.given
    a = parse(
        app_parser(),
        [
            "--kv",
            "paged",
            "--chunked-prefill",
            "--max-batched-tokens",
            "32",
            "--slots",
            "4",
            "--kv-cache-dtype",
            "bf16",
            "--scheduling-policy",
            "priority",
        ],
    )
    assert EngineConfig.from_args(a) == EngineConfig.best(
        max_num_seqs=4,
        max_batched_tokens=32,
        kv_cache_dtype="bfloat16",
        scheduling_policy="priority",
        threads=a.threads,
        seed=a.seed,
    )


def test_serve_seeds_the_generator_its_unseeded_requests_share():
    """``tinyllm serve --seed S`` (vLLM's flag): 0 unless given, as the app's engine."""
    sub = tinyllm_parser().parse_args(["info"]).commands
    assert EngineConfig.from_args(sub["serve"].parse_args([])).seed == 0
    assert EngineConfig.from_args(sub["serve"].parse_args(["--seed", "7"])).seed == 7
    with pytest.raises(SystemExit):
        sub["serve"].parse_args(["--seed", "x"])


def test_generate_and_the_app_sample_with_the_same_options():
    """--temperature, --top-k, --top-p, --max-new-tokens: one definition (args.add_sampling_args);
    only the output length's default differs (generate 200, a new request in the app 120)."""
    generate = actions(tinyllm_parser().parse_args(["info"]).commands["generate"])
    app = actions(app_parser())
    for name in ("temperature", "top_k", "top_p"):
        assert (generate[name].help, generate[name].default) == (app[name].help, app[name].default), name
    assert (generate["max_new_tokens"].default, app["max_new_tokens"].default) == (200, 120)
    assert "(default 200)" in generate["max_new_tokens"].help and "(default 120)" in app["max_new_tokens"].help


def test_a_prefix_of_an_option_is_not_taken_for_it():
    out = subprocess.run(
        [sys.executable, "-m", "tinyllm.cli", "whatif", "burst", "--lanes", "fcfs", "--slot", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # (--slo once read as --slots; --slo is an option of its own now, --slot a prefix of --slots)
    assert out.returncode == 2 and "unrecognized arguments: --slot (see --help)" in out.stderr
    with pytest.raises(SystemExit):
        app_parser().parse_args(["--max-num", "3"])  # (was --max-num-seqs)
