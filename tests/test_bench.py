"""`tinyllm bench` output: the step anatomy adds up, names and bars line up, progress shows when piped.

One tiny bench (a 1-layer random model, 4 requests) runs in this process through the CLI's
main(), its stdout and stderr captured (so stdout is not a terminal, as when piped); the report
is then also re-rendered at terminal widths. Nothing here asserts a speed.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import time

import pytest
import torch
from rich.console import Console

from tinyllm import cli, machine
from tinyllm.bench import COLUMNS, print_report, quiet
from tinyllm.engine import commit, sampler

TINY = "layers=1,d_model=32,heads=2,kv_heads=1,vocab=64,d_ff=64,max_seq_len=256"
TINY_BENCH = f"bench --random-model {TINY} --requests 4 --solo-sample 1 --no-transformers --slots 2 --batch 2"
TINY_BENCH += " --threads 1"  # one tiny run (test_cuda_engine.py and test_cli.py run it too)


def run_tiny(tmp_path_factory, *extra: str) -> tuple[str, str, dict]:
    """(stdout, stderr, the JSON report) of one tiny piped bench run."""
    out_json = tmp_path_factory.mktemp("bench") / "report.json"
    out, err = io.StringIO(), io.StringIO()
    threads = torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main([*TINY_BENCH.split(), "--device", "cpu", "--json", str(out_json), *extra])
    finally:
        torch.set_num_threads(threads)  # --threads sets it for the whole process
    assert rc == 0, err.getvalue()
    return out.getvalue(), err.getvalue(), json.loads(out_json.read_text())


@pytest.fixture(scope="module")
def tiny_bench(tmp_path_factory) -> tuple[str, str, dict]:
    return run_tiny(tmp_path_factory)


def render(report: dict, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    print_report(console, report)
    return console.export_text()


def test_step_anatomy_parts_add_up_to_the_step(tiny_bench):
    """It printed `115.72 ms = forward 248.61 + …`: the parts were timed on other calls than the
    step. Now they are timed inside the same steps and `other` is the remainder."""
    out, _, report = tiny_bench
    keys = ("decode_step", "decode_step_chunked", "decode_step_chunked_wide")  # wide: at max_num_seqs rows
    for key in keys:
        a = report[key]
        assert a["forward_ms"] > 0 and a["sampling_ms"] > 0 and a["other_ms"] >= 0  # both parts were seen
        assert a["forward_ms"] + a["sampling_ms"] + a["other_ms"] == pytest.approx(a["step_ms"], rel=1e-9)
    printed = re.findall(r"([\d.]+) ms = forward ([\d.]+) \+ sampling ([\d.]+) \+ other ([\d.]+) ms", out)
    assert len(printed) == len(keys)
    for step, *parts in printed:  # three parts rounded to 0.01 each
        assert abs(sum(map(float, parts)) - float(step)) <= 0.015 + 1e-9
    assert commit.sample_batch is sampler.sample_batch  # the timing wrappers are gone afterwards


def test_step_is_set_against_the_faster_of_its_kernel_and_pytorchs_gemm(tiny_bench):
    """The floor is the faster of the step's own matmul kernel and PyTorch's GEMM on the same
    shapes: on a machine where our kernel was the slower, the ratio against it alone hid the gap."""
    out, _, report = tiny_bench
    for key in ("decode_step", "decode_step_chunked", "decode_step_chunked_wide"):
        a = report[key]
        assert a["matmul_only_ms"] > 0 and a["library_matmul_ms"] > 0
        assert a["matmul_floor_ms"] == min(a["matmul_only_ms"], a["library_matmul_ms"])
        assert a["step_over_matmul"] == pytest.approx(a["step_ms"] / a["matmul_floor_ms"], rel=1e-9)
    printed = re.findall(
        r"matmuls alone: ([\d.]+) ms \([\d.]+ GFLOP/s\), through PyTorch's GEMM ([\d.]+) ms "
        r"→ step = ([\d.]+)x the faster matmul-only time",
        out,
    )
    assert len(printed) == 3, out
    a = report["decode_step"]
    assert printed[0] == (f"{a['matmul_only_ms']:.2f}", f"{a['library_matmul_ms']:.2f}", f"{a['step_over_matmul']:.2f}")
    older = {k: v for k, v in a.items() if k not in ("library_matmul_ms", "matmul_floor_ms")}
    assert "PyTorch's GEMM" not in render(
        {**report, "decode_step": older, "decode_step_chunked": None, "decode_step_chunked_wide": None}, 200
    )  # a report from before


def test_step_is_also_set_against_the_kv_its_attention_must_read(tiny_bench):
    """The matmuls are not the step's only floor: each decoding row reads its whole context's K/V.
    The bench counts those bytes (every row in lockstep from the same prompt length, so the count
    is known: bytes per token x rows x the mean context over the timed steps) and sets the step
    against matmuls + that read at the machine's measured read rate."""
    out, _, report = tiny_bench
    bpt = report["memory"]["bytes_per_token"]
    for key in ("decode_step", "decode_step_chunked", "decode_step_chunked_wide"):
        a = report[key]
        rounds, warm, n = 4, 3, a["steps"]  # decode_anatomy's defaults
        before = [
            1 + warm * (r + 1) + i
            for r in range(rounds)  # steps taken before each
            for i in range(n * r // rounds, n * (r + 1) // rounds)
        ]  # timed one (1: admission)
        first = 2 if key == "decode_step" else 1  # tokens the admission step leaves: the slot engine's
        contexts = [a["context"] + first + k - 1 for k in before]  # prefills, then decodes every row
        assert a["kv_read_mb"] == pytest.approx(bpt * a["active_rows"] * sum(contexts) / n / 1e6, rel=1e-9)
        assert a["read_gbps"] > 0
        assert a["kv_read_floor_ms"] == pytest.approx(a["kv_read_mb"] / a["read_gbps"], rel=1e-9)
        assert a["step_over_matmul_and_kv"] == pytest.approx(
            a["step_ms"] / (a["matmul_floor_ms"] + a["kv_read_floor_ms"]), rel=1e-9
        )
    printed = re.findall(
        r"Its attention reads ([\d.]+) MB of K/V: ≥ ([\d.]+) ms at the (\d+) GB/s this machine "
        r"reads a buffer that size → step = ([\d.]+)x matmuls \+ K/V read\.",
        out,
    )
    a = report["decode_step"]
    assert len(printed) == 3 and printed[0] == (
        f"{a['kv_read_mb']:.1f}",
        f"{a['kv_read_floor_ms']:.2f}",
        f"{a['read_gbps']:.0f}",
        f"{a['step_over_matmul_and_kv']:.2f}",
    )
    older = {k: v for k, v in a.items() if not k.startswith(("kv_read", "read_gbps", "step_over_matmul_and"))}
    assert "K/V read" not in render(
        {**report, "decode_step": older, "decode_step_chunked": None, "decode_step_chunked_wide": None}, 200
    )  # a report from before


def test_piped_bench_reports_progress_on_stderr_and_keeps_stdout_the_report(tiny_bench):
    out, err, report = tiny_bench
    for path in report["paths"]:
        assert re.search(rf"^bench \[\d+/\d+\] {re.escape(path)}: started$", err, re.M), err
        assert re.search(rf"^bench \[\d+/\d+\] {re.escape(path)}: \d+ tok/s in [\d.]+ s$", err, re.M), err
    assert re.search(r"^bench \[\d+/\d+\] decode-step anatomy: [\d.]+ ms per decode step in", err, re.M)
    assert "tokens/s per path" in out and "tokens/s per path" not in err
    assert "bench [" not in out


@pytest.mark.parametrize("width", [80, 120])
def test_tables_show_every_path_name_and_column_whole(tiny_bench, width):
    """At 120 columns the one table cut every continuous path to `conti…`; columns that do not
    fit now go to a further table, each led by the whole names."""
    text = render(tiny_bench[2], width)
    assert "…" not in text and max(map(len, text.splitlines())) <= width
    memory, slots = text.split("At equal slots")  # the two tables' sections
    for section, table in ((memory, "paths"), (slots, "paths_equal_slots")):
        lines = section.splitlines()
        headers = [[c.strip() for c in line.strip("┃").split("┃")] for line in lines if line.startswith("┃")]
        rows = [[c.strip() for c in line.strip("│").split("│")] for line in lines if line.startswith("│")]
        assert sorted(c for h in headers for c in h[1:]) == sorted(COLUMNS)  # every column once, whole
        for name in tiny_bench[2][table]:
            assert sum(r[0] == name for r in rows) == len(headers)  # its whole name in every table


def test_headline_compares_paths_at_equal_kv_memory(tiny_bench):
    """The headline table gives every path the same KV budget (the memory --slots 2 slots of max_len
    reserve): static and slot KV get 2 rows, the paged paths the same bytes as blocks and up to
    max_num_seqs sequences; the equal-slots table runs every path at 2."""
    out, _, report = tiny_bench
    m = report["memory"]
    assert m["kv_memory_mib"] * 2**20 == 2 * m["max_len"] * m["bytes_per_token"]
    assert m["rows"] == 2 and m["blocks"] * m["block_size"] == 2 * m["max_len"]
    paths, slots = report["paths"], report["paths_equal_slots"]
    assert paths["static"]["seqs"] == paths["continuous-slots"]["seqs"] == 2
    for p in ("continuous-paged", "continuous-chunked", "continuous-chunked-nocache"):
        assert paths[p]["seqs"] == m["max_num_seqs"] and paths[p]["kv_blocks"] == m["blocks"]
        assert slots[p]["seqs"] == 2 and slots[p]["kv_blocks"] == m["blocks"]  # same memory, 2 slots
        assert paths[p]["peak_active"] == 4 > slots[p]["peak_active"]  # all 4 requests at once
        assert paths[p]["kv_reserved_mib"] == pytest.approx(m["kv_memory_mib"])
    assert "At equal KV memory" in out and report["tinyllm_paths_agree"]
    header = " ".join(out[out.index("At equal KV memory") :].split("\n\n")[0].split())
    assert (
        f"static and continuous-slots are sized for max_len {m['max_len']} per row: 2 rows; static batching "
        f"then holds only each batch's padded length" in header
    )
    assert paths["static"]["kv_reserved_mib"] < m["kv_memory_mib"]  # (what that column says)


def test_a_bfloat16_cache_buys_twice_the_blocks_and_every_path_still_agrees(tiny_bench, tmp_path_factory):
    """--kv-cache-dtype bfloat16 at the float32 run's budget: half the bytes per token, twice the
    blocks and rows it buys, every path (and solo, with the same setting) greedy-equal, and the
    header saying which dtype."""
    _, _, fp32 = tiny_bench
    mib = fp32["memory"]["kv_memory_mib"]
    out, _, report = run_tiny(tmp_path_factory, "--kv-cache-dtype", "bfloat16", "--kv-memory", f"{mib!r}")
    m, m32 = report["memory"], fp32["memory"]
    assert (m32["kv_cache_dtype"], m["kv_cache_dtype"]) == ("float32", "bfloat16")
    assert 2 * m["bytes_per_token"] == m32["bytes_per_token"] and m["kv_memory_mib"] == mib
    assert m["blocks"] == 2 * m32["blocks"] and m["rows"] == 2 * m32["rows"]
    assert report["paths"]["static"]["seqs"] == 4 and report["tinyllm_paths_agree"]
    assert "bfloat16 K/V" in out and "float32 K/V" in render(fp32, 400)


@pytest.mark.parametrize("width", [80, 120, 400])
def test_chart_bars_start_in_one_column(tiny_bench, width):
    """`continuous-chunked-nocache` (26 characters) pushed its bar out of line."""
    paths = list(tiny_bench[2]["paths"])
    lines = render(tiny_bench[2], width).splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("tokens/s per path"))
    bars = lines[i + 1 : i + 1 + len(paths)]
    assert [b.split()[0] for b in bars] == paths
    assert len({b.index("█") for b in bars}) == 1


def test_agreement_enforces_every_path_and_at_bfloat16_the_batch_invariant_ones():
    from tinyllm.bench.run import BF16_NOTE, CHECKED, UNCHECKED, agreement

    a, b, c = [1, 2], [3, 4], [5, 6]
    same = {
        "solo": [a],
        "static (memory)": [a, b],
        "continuous-slots (memory)": [a, b],
        "continuous-chunked (memory)": [a, b],
        "continuous-chunked-nocache (slots)": [a, b],
        "transformers": [a, c],
    }
    assert agreement(same, False) == ({**{k: 1.0 for k in same}, "transformers": 0.5}, True, None)
    assert agreement(same, True)[1:] == (True, None)
    solo_off = {**same, "solo": [c]}  # solo generate runs PyTorch's dense attention
    tinyllm = [run for run in same if run not in ("solo", "transformers")]
    assert agreement(solo_off, False)[1:] == (False, None)
    assert agreement(solo_off, True)[1:] == (True, BF16_NOTE + CHECKED.format(", ".join(tinyllm)))
    slots_off = {**same, "continuous-slots (memory)": [a, c]}  # on the C kernels every path must agree
    assert agreement(slots_off, True)[1:] == (False, None)
    # on PyTorch's ragged attention (no compiler) only the token-budget runs are held to it
    chunked = [run for run in slots_off if run.startswith("continuous-chunked")]
    assert agreement(slots_off, True, c_kernels=False)[1:] == (True, BF16_NOTE + CHECKED.format(", ".join(chunked)))
    chunked_off = {**slots_off, "continuous-chunked (memory)": [c, b]}  # a token-budget path differs from another
    agree, ok, note = agreement(chunked_off, True, c_kernels=False)
    assert not ok and note is None and agree["continuous-chunked (memory)"] == 0.5
    one_chunked = {k: v for k, v in slots_off.items() if k != "continuous-chunked-nocache (slots)"}
    assert agreement(one_chunked, True, c_kernels=False)[1:] == (True, BF16_NOTE + UNCHECKED)
    assert agreement(one_chunked, False)[1] is False


def test_others_share_is_the_machines_busy_time_less_this_processs_own():
    before = quiet.Reading(wall=100.0, busy=500.0, own=10.0, cores=2)
    after = quiet.Reading(wall=110.0, busy=518.0, own=18.0, cores=2)  # 18 busy core-s, 8 of them ours
    assert quiet.others_share(before, after) == pytest.approx(10 / 20)
    assert quiet.others_share(before, quiet.Reading(110.0, 508.0, 18.0, 2)) == 0.0  # ticks' rounding: not < 0
    assert quiet.others_share(before, quiet.Reading(110.0, None, 18.0, 2)) is None  # not Linux: not measured
    assert quiet.others_share(before, before) is None  # no time passed


@pytest.mark.skipif(quiet.read().busy is None, reason="no /proc/stat here")
def test_a_process_spinning_beside_the_bench_is_seen():
    """A child spinning on one core while we sleep: its CPU time is the others' (measured before
    it ends, so it is not yet counted as this process's children's)."""
    spinner = subprocess.Popen(
        [sys.executable, "-c", "import time\nprint(flush=True)\nt = time.time()\nwhile time.time() - t < 30: pass"],
        stdout=subprocess.PIPE,
    )
    try:
        assert spinner.stdout.readline() == b"\n"  # it spins now (a fixed wait could end before it starts)
        before = quiet.read()
        time.sleep(1.0)
        share = quiet.others_share(before, quiet.read())
    finally:
        spinner.kill()
        spinner.wait()
        spinner.stdout.close()
    assert share is not None and share >= 0.6 / before.cores, share


def test_the_report_says_when_other_processes_kept_the_machine_busy(tiny_bench):
    _, _, report = tiny_bench
    assert "others_cpu_share" in report["machine"]
    busy = {**report, "machine": {**report["machine"], "others_cpu_share": 0.47, "cpu_count": 2}}
    out = render(busy, 200)
    assert "Other processes kept 47% of this machine's 2 cores busy during the run" in out
    assert out.index("Other processes") < out.index("tok/s")  # before the figures it doubts
    for share in (0.05, None):
        assert "Other processes" not in render(
            {**report, "machine": {**report["machine"], "others_cpu_share": share}}, 200
        )


def test_a_busy_core_under_a_thread_of_the_run_is_named_as_the_cause():
    """One core of two kept busy ran a 2-thread bench ~10x slower (each step waits for its thread
    on the busy core): the warning says so and names the fix; with threads to spare it does not."""
    said = quiet.warning(0.42, 2, threads=2)
    assert "This run's 2 threads outnumbered the ~1.2 cores left free" in said and "--threads 1" in said
    assert "many times too low" in said
    for threads in (1, None):
        assert "outnumbered" not in quiet.warning(0.42, 2, threads) and "quiet machine" in quiet.warning(
            0.42, 2, threads
        )
    assert "outnumbered" not in quiet.warning(0.2, 16, threads=2)  # 12.8 cores free
    assert quiet.warning(0.1, 2, threads=2) is None


def test_the_bench_says_every_tinyllm_path_runs_the_same_kernels(tiny_bench):
    """x static compared a PyTorch-attention path with a C-kernel one; now every tinyllm path runs
    one forward, and the bench says which."""
    from tinyllm.engine.forward import kernels_for

    out, _, report = tiny_bench
    assert report["kernels"] == kernels_for("cpu", torch.float32)
    assert f"Every tinyllm path runs one forward ({report['kernels']}" in " ".join(out.split())


def test_the_report_names_the_cpu_its_figures_are_from(tiny_bench):
    """Figures are one machine's: the header names its CPU (platform.processor() said "x86_64")."""
    out, _, report = tiny_bench
    assert report["machine"]["processor"] == machine.cpu_name()
    assert f"cpu × 1 thread on {machine.cpu_name()}" in " ".join(out.split()[:40])
