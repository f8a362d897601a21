"""How the bench says what it measured: progress on stderr while it runs, then the table(s) and
the chart, whole at any width (a path's name is never cut)."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from tinyllm.bench.quiet import warning
from tinyllm.config import EngineConfig
from tinyllm.units import count, duration

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

WIDE_CONSOLE = 400  # columns when stdout is not a terminal: wide enough for every figure


def stdout_console() -> Console:
    """The report's console: the terminal's width, or piped (CI, `| tee`, a file) wide enough that
    no column is dropped or folded (the bench and what-if alike)."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=WIDE_CONSOLE)


COLUMNS = (
    "tok/s",
    "x static",
    "seqs",
    "TTFT p50",
    "TTFT p95",
    "latency p95",
    "row util",
    "KV reserved MiB",
    "KV used MiB",
    "KV used mean",
    "used/alloc",
    "preempt",
    "prefill tok",
    "roofline",
    "greedy =",
)
SLO_COLUMNS = ("goodput", "SLO met")  # with --slo (or a workload line's own): after the figures


def columns_of(report: dict) -> tuple[str, ...]:
    """The table's columns: the SLO's two where the run judged its requests (older reports: none)."""
    return COLUMNS + SLO_COLUMNS if report.get("slo_judged") else COLUMNS


def slo_cells(s: dict | None) -> tuple[str, str]:
    """goodput (requests/s that met the SLO) and ``met/judged (share)``; "—" for a path not judged."""
    if not s:
        return "—", "—"
    judged = s["met"] + s["missed"]
    share = "" if s["share_met"] is None else f" ({s['share_met']:.0%})"
    return f"{s['goodput_rps']:.2f}/s", f"{s['met']}/{judged}{share}"


class BenchProgress:
    """Where a bench run is. In a terminal: rich's transient bar, gone before the report. Piped (CI,
    `| tee`), where that bar shows nothing until the end, one plain line on stderr as each stage
    starts and as it ends, with its figure: a long run shows it is alive, stdout stays the report."""

    def __init__(self, console: Console, stages: int, lines: bool) -> None:
        self.stages, self.n, self.stage, self.t0 = stages, 0, "", 0.0
        self.bar = None
        if not lines:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            )
            self.task = self.bar.add_task("", total=stages)

    def __enter__(self) -> BenchProgress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()

    def start(self, stage: str) -> None:
        self.n, self.stage, self.t0 = self.n + 1, stage, time.perf_counter()
        if self.bar is not None:
            self.bar.update(self.task, description=stage)
        else:
            self._line("started")

    def done(self, figure: str = "") -> None:
        if self.bar is not None:
            self.bar.advance(self.task)
        else:
            self._line(f"{figure or 'done'} in {time.perf_counter() - self.t0:.1f} s")

    def _line(self, what: str) -> None:
        print(f"bench [{self.n}/{self.stages}] {self.stage}: {what}", file=sys.stderr, flush=True)


def path_cells(report: dict, table: str = "paths") -> dict[str, dict[str, str]]:
    """Each path's figures as printed, by column, for one table ("paths": at equal KV memory;
    "paths_equal_slots"). seqs: rows (static, slot KV) or the cap on running sequences (paged);
    roofline: 2 x params x tok/s over the peak 1024² matmul rate, the share of the compute limit."""
    static = report[table]["static"]["tok_s"]
    flop_per_tok = 2 * report["model"]["params"] / 1e9
    peak = report["machine"]["peak_matmul_gflops_1024"]

    def f(x, fmt: str = "{:.2f}") -> str:
        return "—" if x is None else fmt.format(x)

    return {
        name: dict(
            zip(
                COLUMNS + SLO_COLUMNS,
                (
                    f(s["tok_s"], "{:.0f}"),
                    f(s["tok_s"] / static, "{:.2f}x"),
                    f(s.get("seqs"), "{}"),
                    duration(s.get("ttft_p50_s")),
                    duration(s.get("ttft_p95_s")),
                    duration(s.get("latency_p95_s")),
                    f(s.get("row_util"), "{:.0%}"),
                    f(s.get("kv_reserved_mib"), "{:.1f}"),
                    f(s.get("kv_used_mib_mean"), "{:.1f}"),
                    f(s.get("kv_used_mean"), "{:.0%}"),
                    f(s.get("kv_alloc_used_mean"), "{:.0%}"),
                    f(s.get("preemptions"), "{}"),
                    f(s.get("prefill_tokens_computed"), "{:,}"),
                    f(s["tok_s"] * flop_per_tok / peak if peak else None, "{:.1%}"),
                    f(s.get("greedy_agree"), "{:.0%}"),
                    *slo_cells(s.get("slo")),
                ),
            )
        )
        for name, s in report[table].items()
    }


def _table(cells: dict[str, dict[str, str]], columns: list[str]) -> Table:
    from rich.table import Table

    t = Table()
    t.add_column("path", no_wrap=True, min_width=max(map(len, cells)))
    for col in columns:
        t.add_column(col, justify="right", overflow="fold")
    for name, row in cells.items():
        t.add_row(name, *(row[c] for c in columns))
    return t


def path_tables(console: Console, report: dict, table: str = "paths") -> list[Table]:
    """The paths' figures in as few tables as fit the console, each led by the whole path name.
    Squeezed into one table, rich cuts the names (six rows of `conti…`) and the figures; here a
    column that would not fit starts the next table instead."""
    cells = path_cells(report, table)
    unbounded = console.options.update_width(10_000)
    groups: list[list[str]] = [[]]
    for col in columns_of(report):
        if groups[-1] and console.measure(_table(cells, groups[-1] + [col]), options=unbounded).maximum > console.width:
            groups.append([])
        groups[-1].append(col)
    return [_table(cells, g) for g in groups]


def _library_matmul(anatomy: dict) -> str:
    """The same matmuls through PyTorch's GEMM, where the report has them (older reports do not)."""
    ms = anatomy.get("library_matmul_ms")
    return f", through PyTorch's GEMM {ms:.2f} ms" if ms is not None else ""


def _kv_read(anatomy: dict) -> str:
    """The attention's own floor, the K/V it must read, where the report has it (older ones do not)."""
    if anatomy.get("kv_read_floor_ms") is None:
        return ""
    return (
        f" Its attention reads {anatomy['kv_read_mb']:.1f} MB of K/V: ≥ {anatomy['kv_read_floor_ms']:.2f} ms at "
        f"the {anatomy['read_gbps']:.0f} GB/s this machine reads a buffer that size → step = "
        f"{anatomy['step_over_matmul_and_kv']:.2f}x matmuls + K/V read."
    )


def speculation_lines(report: dict, table: str) -> list[str]:
    """With --speculative-config: what each token-budget path's drafts did (engine/speculate.py),
    or that it drafted nothing (off from disable_by_batch_size decoding sequences)."""
    spec = report.get("speculative")
    if not spec:
        return []
    who = f"the draft model {spec['speculative_model']}" if spec.get("speculative_model") else "n-gram lookup"
    lines = []
    for path, s in report[table].items():
        if not path.startswith("continuous-chunked"):
            continue
        drafted, kept, drafts = s.get("spec_draft_tokens", 0), s.get("spec_accepted_tokens", 0), s.get("spec_drafts", 0)
        lines.append(
            f"{path}: speculation by {who}, k={spec['num_speculative_tokens']}: "
            + (
                f"drafts kept {kept:,} of {drafted:,} tokens ({kept / drafted:.0%}) in {drafts:,} drafts, "
                f"{1 + kept / drafts:.2f} tokens a drafted step"
                if drafted
                else f"nothing drafted ({why_no_drafts(spec)})"
            )
        )
    return lines


def why_no_drafts(spec: dict) -> str:
    """Why a speculating path may draft nothing: its batch, or its requests."""
    off = spec.get("speculative_disable_by_batch_size", EngineConfig.speculative_disable_by_batch_size)
    batch = f"off in steps of {off} decoding sequences or more; " if off is not None else ""
    return f"{batch}drafted are greedy and unseeded sampled requests without penalties or logprobs"


def print_report(console: Console, report: dict) -> None:
    paths = report["paths"]
    console.print(
        f"[bold]tinyllm bench[/] — {report['model']['name']} ({report['model']['params'] / 1e6:.1f}M params), "
        f"{report['workload']}, {report['slots']} slots / batch {report['batch']}, "
        f"{report['machine']['device']} × {count(report['machine']['torch_threads'], 'thread')}"
        + (f" on {report['machine']['processor']}" if report["machine"].get("processor") else "")
    )
    busy = warning(
        report["machine"].get("others_cpu_share"),
        report["machine"]["cpu_count"] or 1,
        report["machine"].get("torch_threads"),
    )
    if busy:  # before any figure it casts doubt on
        console.print(f"[bold yellow]{busy}[/]")
    if report.get("kernels"):
        console.print(
            f"Every tinyllm path runs one forward ({report['kernels']}, ragged over a block pool): the paths "
            "differ in their schedules, so x static measures scheduling alone (transformers: its own kernels)."
        )
    m = report["memory"]
    by_rows = [p for p in ("static", "continuous-slots") if p in paths]
    paged = [p for p in paths if p.startswith("continuous-") and p != "continuous-slots"]
    rows = (
        f"{' and '.join(by_rows)} {'are' if len(by_rows) > 1 else 'is'} sized for max_len {m['max_len']} "
        f"per row: {m['rows']} rows"
        + (
            "; static batching then holds only each batch's padded length (its KV reserved column)"
            if "static" in by_rows
            else ""
        )
    )
    pool = (
        f"the paged paths get {m['blocks']} blocks of {m['block_size']} and run up to {m['max_num_seqs']} sequences "
        f"(max_num_seqs) in them, preempting when the pool runs out"
        if paged
        else ""
    )
    console.print(
        f"[bold]At equal KV memory: {m['kv_memory_mib']:.1f} MiB per path[/] ({m['bytes_per_token']:,} bytes "
        f"per token, {m.get('kv_cache_dtype', 'float32')} K/V): " + "; ".join(x for x in (rows, pool) if x) + "."
    )
    for t in path_tables(console, report):
        console.print(t)
    for line in speculation_lines(report, "paths"):
        console.print(line)
    if report.get("slo_judged"):
        target = f"--slo {report['slo']}" if report.get("slo") else "the workload lines' own SLOs"
        console.print(
            f"goodput: requests per second that met {target} over the path's wall time (every request "
            "arrives at t=0); SLO met: of the requests judged, those that met it."
        )
    if report.get("agreement_note"):
        console.print(f"[yellow]note:[/] {report['agreement_note']}")
    name_w = max(map(len, paths))  # every bar starts in the same column, whatever the names
    width = max(10, min(40, console.width - name_w - 12))
    top = max(s["tok_s"] for s in paths.values())
    console.print("[bold]tokens/s per path[/]")
    for name, s in paths.items():
        n = max(1, round(width * s["tok_s"] / top)) if s["tok_s"] > 0 else 0
        console.print(f"  {name:<{name_w}}  {'█' * n}{' ' * (width - n)} {s['tok_s']:.0f}")
    if report.get("paths_equal_slots"):
        console.print(
            f"[bold]At equal slots: {report['slots']} sequences per path[/] (static: batch "
            f"{report['batch']}; the paged pool as large as the slots' memory): the scheduler alone."
        )
        for t in path_tables(console, report, "paths_equal_slots"):
            console.print(t)
        for line in speculation_lines(report, "paths_equal_slots"):
            console.print(line)
    for key, what in (
        ("decode_step", "decode step (slot KV)"),
        ("decode_step_chunked", "chunked step, all decoding"),
        ("decode_step_chunked_wide", "chunked step, all decoding"),
    ):
        a = report.get(key)
        if not a:
            continue
        console.print(
            f"[bold]{what}, {a['active_rows']} active rows, context ~{a['context']}[/]: {a['step_ms']:.2f} ms = "
            f"forward {a['forward_ms']:.2f} + sampling {a['sampling_ms']:.2f} + other {a['other_ms']:.2f} ms "
            f"(mean of {a['steps']} steps); the same rows' matmuls alone: {a['matmul_only_ms']:.2f} ms "
            f"({a['matmul_gflops']:.1f} GFLOP/s){_library_matmul(a)} → step = {a['step_over_matmul']:.2f}x the "
            f"{'faster ' if a.get('library_matmul_ms') is not None else ''}matmul-only time.{_kv_read(a)}"
        )
    console.print(
        "(forward: the model call; sampling: choosing each row's next token; other: the rest of the "
        "same steps — scheduling, KV bookkeeping, Python.)"
    )
    console.print(
        f"Peak 1024² matmul: {report['machine']['peak_matmul_gflops_1024']:.0f} GFLOP/s. CPU "
        f"float32 kernels: {report['machine'].get('paged_decode_attention', 'not recorded')}."
    )
    a = report["decode_step"]
    g = report.get("decode_step_cuda_graph")
    if g:
        console.print(
            f"[bold]CUDA graph decode step[/]: {g['step_ms']:.2f} ms vs eager {a['step_ms']:.2f} ms "
            f"({a['step_ms'] / g['step_ms']:.2f}x)"
        )
