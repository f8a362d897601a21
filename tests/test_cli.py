"""The `tinyllm` command: reproducible generation, the bundled model's quality, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tinyllm import native
from tinyllm.model.checkpoint import default_model_dir, load_checkpoint

DATA = Path(__file__).parent / "data"


def tinyllm(*args: str) -> subprocess.CompletedProcess:
    """``tinyllm ARGS`` as its own process: where the test is about the process (its exit status,
    its output piped), not only about what the command says."""
    return subprocess.run([sys.executable, "-m", "tinyllm.cli", *args], capture_output=True, text=True, timeout=300)


def in_process(capsys, *args: str) -> subprocess.CompletedProcess:
    """``tinyllm ARGS`` run by ``main`` in this process (no second torch import: seconds less), as
    a CompletedProcess."""
    from tinyllm.cli import main

    try:
        code = main(list(args))
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["tinyllm", *args], code, out, err)


def test_seeded_generate_is_reproducible_and_streams_text(capsys):
    a = in_process(capsys, "generate", "ROMEO:", "--max-new-tokens", "40", "--seed", "3")
    b = in_process(capsys, "generate", "ROMEO:", "--max-new-tokens", "40", "--seed", "3")
    c = in_process(capsys, "generate", "ROMEO:", "--max-new-tokens", "40", "--seed", "4")
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout and a.stdout.startswith("ROMEO:")
    assert len(a.stdout) > len("ROMEO:") + 20
    assert c.stdout != a.stdout


def test_info_reports_the_bundled_model(capsys):
    r = in_process(capsys, "info")
    assert r.returncode == 0, r.stderr
    model, _ = load_checkpoint()
    assert f"{model.num_params():,}" in r.stdout and "KV bytes per token" in r.stdout
    bpt = sum(2 * b.self_attn.n_kv_heads * b.self_attn.head_dim for b in model.layers)  # K and V, every layer
    assert f"{4 * bpt:,} (float32, the default on cpu)" in r.stdout and f"{2 * bpt:,} at" in r.stdout
    assert "--kv-cache-dtype bfloat16" in r.stdout
    says = "C kernels (csrc/" if native.library() is not None else f"PyTorch: {native.why_not}"
    assert says in r.stdout  # which kernels this machine runs


BAD_INPUT = [
    (("generate", "x", "--model", "/nonexistent/dir"), "not a directory"),
    (("generate", "x", "--temperature", "-1"), "expected a finite number >= 0"),
    (("generate", "x", "--top-p", "2"), "expected a number in (0, 1]"),
    (("generate", "x", "--max-new-tokens", "0"), "expected an integer >= 1"),
    (("generate", "x", "--bogus"), "unrecognized arguments: --bogus"),
    (("generate", "ROMEO " * 600), "the model's context is 512 tokens"),
    (("info", "--model", str(DATA)), "no config.json"),
    (
        ("train", "--out", "/tmp/x", "--draft-for", str(DATA)),
        "--draft-for " + str(DATA) + ": not a checkpoint directory",
    ),
    (("frobnicate",), "invalid choice"),
    (
        ("bench", "--kv-cache-dtype", "fp8"),
        "argument --kv-cache-dtype: expected auto, float32 or bfloat16 (fp32, bf16), got 'fp8'",
    ),
    (("serve", "--kv-cache-dtype", "float16"), "argument --kv-cache-dtype: expected auto, float32 or bfloat16"),
    (
        ("whatif", "shakespeare_openings", "--lanes", "fcfs", "fcfs kv_dtype=half"),
        "kv_dtype must be one of auto, float32, bfloat16 (fp32, bf16), got 'half'",
    ),
    # said before anything runs, not as a traceback at the end (a new user's finds)
    (
        ("bench", "--random-model", "--no-transformers", "--requests", "1", "--kv-memory", "1e9"),
        "--kv-memory: a KV cache of 1,000,000,000 MiB is more than the",
    ),
    (
        ("bench", "--random-model", "--requests", "1", "--max-num-seqs", "300"),
        "--max-batched-tokens 256 is less than the 300 sequences the token-budget paths may run",
    ),
    (
        ("bench", "--json", "/nonexistent/dir/b.json"),
        "argument --json: cannot write /nonexistent/dir/b.json: no folder",
    ),
    (("whatif", "shakespeare_openings", "--json", "/nonexistent/x.json"), "cannot write /nonexistent/x.json"),
    (("serve", "--kv-memory", "1e9"), "--kv-memory: a KV cache of 1,000,000,000 MiB is more than the"),
    (("whatif", "--bogus"), "tinyllm whatif: error: unrecognized arguments: --bogus"),  # not "required: ..."
    (("whatif", "burst", "--lanes", "static", "chunked", "--bogus=3"), "unrecognized arguments: --bogus=3"),
    (("bench", "--random-model", "--requests", "1", "--workload", "nosuch"), "not a bundled workload (bundled: "),
    (
        ("bench", "--random-model", "--requests", "1", "--kv-memory", "0.01"),
        "--kv-memory 0.01 MiB is too small for one request: a row reserves max_len 512 tokens",
    ),
    (
        ("serve", "--kv-memory", "8", "--max-num-seqs", "1000"),
        "the token budget per step (--max-batched-tokens, 256) is less than the 1000 sequences that may run",
    ),
]

# Every bad command line of BAD_INPUT through the CLI's main() in one child process (a process
# each cost ~4 s of importing torch): its exit status and what it wrote to stderr. An exception
# escaping main() is printed as the traceback Python would have printed, status 1.
_RUN_EACH = """
import contextlib, io, json, sys, traceback
from tinyllm.cli import main
runs = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
        except BaseException:
            traceback.print_exc()
            rc = 1
    runs.append([rc, err.getvalue()])
print(json.dumps(runs))
"""


@pytest.fixture(scope="module")
def bad_input_runs() -> dict[tuple[str, ...], tuple[int, str]]:
    argvs = [list(args) for args, _ in BAD_INPUT]
    r = subprocess.run(
        [sys.executable, "-c", _RUN_EACH, json.dumps(argvs)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    return {args: (rc, err) for (args, _), (rc, err) in zip(BAD_INPUT, json.loads(r.stdout))}


@pytest.mark.parametrize("args, message", BAD_INPUT)
def test_bad_input_is_one_line_and_exit_2(bad_input_runs, args, message):
    rc, stderr = bad_input_runs[args]
    assert rc == 2
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


def test_the_cli_process_itself_exits_2_with_one_line():
    """The same contract through ``python -m tinyllm.cli`` (its exit status is main()'s)."""
    r = tinyllm("generate", "x", "--top-p", "2")
    assert r.returncode == 2 and "expected a number in (0, 1]" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_broken_model_dir_is_exit_2(tmp_path, capsys):
    d = tmp_path / "m"
    d.mkdir()
    for f in default_model_dir().iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    (d / "model.safetensors").write_bytes(b"junk")
    r = in_process(capsys, "generate", "x", "--model", str(d))
    assert r.returncode == 2 and "cannot read safetensors" in r.stderr and "Traceback" not in r.stderr


def test_bench_output_keeps_every_figure_whole_when_piped():
    """Piped (as in CI), rich used to squeeze the table to 80 columns: `tok…`, `0.…`."""
    from tests.test_bench import TINY_BENCH
    from tinyllm.bench import COLUMNS

    r = tinyllm(*TINY_BENCH.split())
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout
    header = next(line for line in r.stdout.splitlines() if "path" in line and "tok/s" in line)
    for col in COLUMNS:
        assert col in header
    for path in (
        "solo",
        "static",
        "continuous-slots",
        "continuous-paged",
        "continuous-chunked",
        "continuous-chunked-nocache",
    ):
        row = next(line for line in r.stdout.splitlines() if line.startswith(f"│ {path} "))
        cells = [c.strip() for c in row.strip("│").split("│")]
        assert len(cells) == len(COLUMNS) + 1 and cells[0] == path and cells[-1] == "100%"
        assert float(cells[1]) > 0 and cells[2].endswith("x")


def test_tui_broken_weights_are_reported_by_the_engine_process(tmp_path):
    """config.json and the tokenizer are fine (checked in the app); the weights are read in the
    engine process, whose error must come back as the same one line, exit 2, no traceback."""
    d = tmp_path / "m"
    d.mkdir()
    for f in default_model_dir().iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    (d / "model.safetensors").write_bytes(b"junk")
    code, err = run_in_a_terminal([sys.executable, "-m", "tui.cli", "--model", str(d)], timeout=120)
    assert code == 2 and "--model:" in err and "cannot read safetensors" in err
    assert "Traceback" not in err


def run_in_a_terminal(argv: list[str], timeout: float) -> tuple[int, str]:
    """(exit status, stderr) of the app run with a pseudo-terminal for stdin and stdout (it refuses
    to start without one), whatever it draws read and dropped so it never blocks on a full pty."""
    import os
    import pty
    import threading

    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=subprocess.PIPE, text=True)
    os.close(slave)

    def drain() -> None:
        try:
            while os.read(master, 65536):
                pass
        except OSError:  # the app exited: the pty closed
            pass

    threading.Thread(target=drain, daemon=True).start()
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
        os.close(master)
    return proc.returncode, err


@pytest.mark.parametrize(
    "args, message",
    [
        (("--kv", "slots", "--chunked-prefill"), "--chunked-prefill needs --kv paged"),
        (
            ("--no-chunked-prefill", "--max-batched-tokens", "64"),
            "--max-batched-tokens applies to chunked prefill only",
        ),
        (("--slots", "16", "--max-batched-tokens", "8"), "--max-batched-tokens 8 is less than --slots 16"),
        (("--threads", "0"), "expected an integer >= 1"),
        (("--no-chunked-prefill", "--prefix-cache"), "--prefix-cache needs chunked prefill"),
        (("--prompts", "no_such_workload"), "not a bundled workload (bundled: batch_and_chat, burst,"),
    ],
)
def test_tui_scheduler_flags_are_checked_before_the_ui(args, message):
    r = subprocess.run([sys.executable, "-m", "tui.cli", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_tui_bad_arguments_exit_2_before_the_ui():
    r = subprocess.run([sys.executable, "-m", "tui.cli", "--slots", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "expected an integer >= 1" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "tui.cli", "--kv-cache-dtype", "fp8"], capture_output=True, text=True, timeout=60
    )
    assert (
        r.returncode == 2 and "--kv-cache-dtype: expected auto, float32 or bfloat16 (fp32, bf16), got 'fp8'" in r.stderr
    )
    r = subprocess.run(
        [sys.executable, "-m", "tui.cli", "--prompts", str(DATA / "heldout_julius_caesar.txt")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "heldout_julius_caesar.txt:1: invalid JSON" in r.stderr


def test_shipped_checkpoint_is_trained():
    """Held-out text the model never saw (a slice of Julius Caesar) scores well below 2 nats/char."""
    from tinyllm.model.train import eval_text

    model, tok = load_checkpoint()
    npc = eval_text(model, tok, [(DATA / "heldout_julius_caesar.txt").read_text()])
    assert npc < 2.0


def test_shipped_checkpoint_loads_in_transformers_with_equal_logits():
    transformers = pytest.importorskip("transformers")
    model, tok = load_checkpoint()
    hf = transformers.LlamaForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32).eval()
    ids = torch.tensor([tok.encode("ROMEO:\nBut soft, what light through yonder window breaks?")])
    with torch.no_grad():
        assert (hf(ids).logits - model(ids)[0]).abs().max().item() < 1e-3
    cfg = json.loads((default_model_dir() / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    size = sum(f.stat().st_size for f in default_model_dir().iterdir())
    assert size <= 25 * 2**20


# -- tinyllm-tui: refused before the UI starts (one line on stderr, exit 2, no screen drawn) ------------
def tui_process(*args: str) -> subprocess.CompletedProcess:
    """``tinyllm-tui ARGS`` as its own process, stdin not a terminal: where the test is about the
    process (its exit status, that nothing it started outlives it)."""
    return subprocess.run(
        [sys.executable, "-m", "tui.cli", *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )


def tui(*args: str) -> subprocess.CompletedProcess:
    """``tinyllm-tui ARGS`` run by ``main`` in this process (no second interpreter: a third of a
    second each), as a CompletedProcess; pytest's stdin is not a terminal, as the process's is
    not. Any app that would start to run fails the test instead."""
    import contextlib
    import io
    from unittest import mock

    from textual.app import App

    from tui.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), mock.patch.object(App, "run", side_effect=AssertionError("the app ran")):
        try:
            code = main(list(args))
        except SystemExit as e:  # (argparse's refusals)
            code = e.code
    return subprocess.CompletedProcess(["tinyllm-tui", *args], code, "", err.getvalue())


def assert_refused_before_the_ui(r: subprocess.CompletedProcess, message: str) -> None:
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "\x1b" not in r.stderr  # no screen was drawn


@pytest.mark.parametrize(
    "path, message",
    [
        ("/proc/run.jsonl", "--record /proc/run.jsonl: cannot write it ("),  # access() says yes; open() says no
        ("", "--record needs a file name, e.g. --record run.jsonl"),
    ],
)
def test_tui_record_to_a_file_it_cannot_create_is_refused_before_the_ui(path, message):
    assert_refused_before_the_ui(tui("--record", path), message)
    assert not Path("/proc/run.jsonl").exists()


def test_slots_beside_a_kv_budget_is_refused_everywhere(capsys):
    """`--slots 4 --kv-memory 8` ran 64 sequences (the budget's cap): --slots was ignored."""
    want = "--slots is the number of sequences without a KV budget: with --kv-memory the budget sizes the cache"
    assert_refused_before_the_ui(tui("--slots", "4", "--kv-memory", "8"), want)
    from tinyllm.cli import main

    assert main(["serve", "--slots", "4", "--kv-memory", "8"]) == 2
    assert want in capsys.readouterr().err


def test_tui_without_a_terminal_says_so_instead_of_spinning(tmp_path):
    """`tinyllm-tui --prompts burst </dev/null >out.txt` drew into the file and spun a core on the
    closed stdin for as long as it ran; its engine process must not outlive the refusal either."""
    for extra in ((), ("--engine-thread",)):  # good arguments, no terminal
        r = tui_process("--record", str(tmp_path / "run.jsonl"), *extra)
        assert_refused_before_the_ui(
            r,
            "the app draws in a terminal and its stdin is not one (redirected?); run "
            "it in a terminal, or in a browser with --web",
        )
        assert not (tmp_path / "run.jsonl").exists()  # refused before any work: no recording
    assert_refused_before_the_ui(tui("--replay", str(DATA / "preemption-run.jsonl")), "its stdin is not one")
    r = tui("--race", "--lanes", "static", "nope")  # the arguments' own errors come first
    assert_refused_before_the_ui(r, "'nope' is neither a lane kind")


def test_tui_record_never_overwrites_a_recording(tmp_path):
    run = tmp_path / "run.jsonl"
    run.write_bytes((DATA / "preemption-run.jsonl").read_bytes())
    before = run.read_bytes()
    r = tui("--record", str(run))
    assert_refused_before_the_ui(
        r,
        f"--record {run}: the file exists ({len(before):,} bytes) and would be "
        f"overwritten; choose another name or remove it",
    )
    assert run.read_bytes() == before


@pytest.mark.parametrize(
    "blocks, says",
    [
        (
            "1",
            "--kv-blocks 1 is too small for one request: the pool holds 1 block of 16 tokens (16 tokens), one "
            "request of --max-len 512 needs 32 (raise --kv-blocks to 32 or lower --max-len to 16)",
        ),
        ("31", "--kv-blocks 31 is too small for one request: the pool holds 31 blocks of 16 tokens (496 tokens)"),
    ],
)
def test_tui_kv_blocks_too_few_for_one_request_are_refused_as_serve_does(blocks, says):
    assert_refused_before_the_ui(tui("--kv-blocks", blocks), says)


@pytest.mark.parametrize(
    "args, says",
    [
        (("--kv", "slots", "--kv-blocks", "64"), "--kv-blocks goes with --kv paged (the slot cache has no blocks"),
        (("--kv", "slots", "--block-size", "16"), "--block-size goes with --kv paged (the slot cache has no blocks"),
    ],
)
def test_tui_block_options_with_the_slot_cache_are_refused_not_ignored(args, says):
    assert_refused_before_the_ui(tui(*args), says)


def test_tui_max_len_beyond_the_model_is_refused_before_the_ui():
    assert_refused_before_the_ui(tui("--max-len", "99999"), "--max-len 99999 is more than the model's context (512)")


REPLAY = ("--replay", str(DATA / "preemption-run.jsonl"))
WHY_REPLAY = "does not apply to --replay (a replay shows the recorded run: no model, no engine, no new requests)"
WHY_ATTACH = "does not apply to --attach (the server runs its own engine, at its own settings and pace)"
WHY_RACE = "does not apply to --race (the race is greedy, and each request's max_new_tokens comes from its workload)"


@pytest.mark.parametrize(
    "args, message",
    [
        ((*REPLAY, "--slots", "4"), f"--slots {WHY_REPLAY}"),
        ((*REPLAY, "--model", "/nonexistent"), f"--model {WHY_REPLAY}"),
        ((*REPLAY, "--temperature", "5"), f"--temperature {WHY_REPLAY}"),
        ((*REPLAY, "--no-prefix-cache"), f"--no-prefix-cache {WHY_REPLAY}"),
        ((*REPLAY, "--kv-events", "tcp://127.0.0.1:5557"), f"--kv-events {WHY_REPLAY}"),
        ((*REPLAY, "--slots", "8"), f"--slots {WHY_REPLAY}"),  # typed, even at its default value
        ((*REPLAY, "--wait", "5"), f"--wait {WHY_REPLAY}"),
        (("--race", "--wait", "5"), f"--wait {WHY_RACE}"),
        (("--wait", "5"), "--wait applies to --attach (how long to wait for the server to listen)"),
        (("--race", "--temperature", "5"), f"--temperature {WHY_RACE}"),
        (
            ("--race", "--kv-events", "tcp://127.0.0.1:5557"),
            "--kv-events does not apply to --race (it draws a vLLM server's prefix cache: --attach)",
        ),
        (("--attach", "127.0.0.1:9", "--slots", "3"), f"--slots {WHY_ATTACH}"),
        (("--attach", "127.0.0.1:9", "--paused"), f"--paused {WHY_ATTACH}"),
    ],
)
def test_tui_an_option_its_mode_does_not_use_is_refused(args, message):
    assert_refused_before_the_ui(tui(*args), message)


@pytest.mark.parametrize(
    "mode, argv",
    [
        ("--replay", ["--replay", "r.jsonl", "--paused", "--step-delay", "5", "--web", "--port", "9000"]),
        (
            "--attach",
            [
                "--attach",
                "h:1",
                "--wait",
                "0",
                "--kv-events",
                "tcp://h:2",
                "--model",
                "m",
                "--prompts",
                "burst",
                "--temperature",
                "0",
                "--top-k",
                "3",
                "--top-p",
                "0.5",
                "--max-new-tokens",
                "9",
            ],
        ),
        (
            "--race",
            [
                "--race",
                "burst",
                "--lanes",
                "static",
                "chunked",
                "--batch-timeout",
                "1",
                "--model",
                "m",
                "--device",
                "cpu",
                "--slots",
                "4",
                "--kv-memory",
                "8",
                "--max-num-seqs",
                "4",
                "--max-len",
                "64",
                "--max-batched-tokens",
                "64",
                "--threads",
                "1",
                "--block-size",
                "8",
                "--kv-blocks",
                "9",
                "--seed",
                "1",
                "--kv-cache-dtype",
                "bf16",
                "--paused",
                "--step-delay",
                "5",
                "--engine-thread",
            ],
        ),
    ],
)
def test_tui_the_options_a_mode_uses_are_not_refused(mode, argv):
    from tui.cli import build_parser, parse
    from tui.cli_checks import refuse_unused

    parser = build_parser()
    refuse_unused(parser, parse(parser, argv), mode)  # no SystemExit


def test_a_bad_flag_is_refused_before_textual_or_torch_loads():
    """A typo took 7-9 s to be refused on a busy machine: Textual (and for --tune, torch) loaded
    first. A fresh interpreter is the only place to see what was imported (one, for all three)."""
    code = (
        "import sys\n"
        "from tui.cli import main\n"
        "for argv in (['--bogus'], ['--tune', 'poisson_arrivals'], ['--tune', 'nowhere.jsonl', '--slo', 'ttft=1s']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 2, (argv, e.code)\n"
        "print(sorted(m for m in ('textual', 'torch') if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout
    errors = r.stderr.strip().splitlines()
    assert len(errors) == 3 and "unrecognized arguments: --bogus" in errors[0] and "needs an SLO" in errors[1], errors
