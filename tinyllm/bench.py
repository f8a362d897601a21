"""`tinyllm bench`: one seeded workload through every path, with the figures users choose by.

Paths: solo ``generate`` (a sample), ``run_static``, ``run_continuous`` with slot and paged KV,
and ``transformers`` ``generate`` on the same checkpoint in padded static batches (when
installed). Greedy outputs are checked to agree before any figure is printed. Then a decode
step with every slot active is taken apart: model forward + sampling + the rest (scheduling, KV
bookkeeping, Python), all timed inside the same steps, against the time the same rows' matmuls
alone take on this machine (the practical limit).
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tinyllm.model.config import ModelConfig
from tinyllm.model.device import resolve_device
from tinyllm.engine import (DEFAULT_MAX_BATCHED_TOKENS, ContinuousEngine, Request, percentile, run_continuous,
                            run_static)
from tinyllm.engine import continuous
from tinyllm.engine.generate import generate
from tinyllm.model.transformer import Transformer
from tinyllm.request import ContextTooLong, check_fits
from tinyllm.workload import resolve_workload

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

WIDE_CONSOLE = 400          # columns when stdout is not a terminal: wide enough for every figure
RANDOM_DEFAULTS = dict(layers=4, d_model=256, heads=4, kv_heads=2, vocab=4096, d_ff=704, max_seq_len=512)


# -- workloads and models -------------------------------------------------------------------------
def default_workload(n: int, vocab: int, seed: int = 0, prompt_len=(8, 64), new=(8, 128)) -> list[Request]:
    """Seeded: prompt lengths and max_new_tokens uniform in the given ranges, greedy, no EOS
    (every path then produces exactly the same number of tokens)."""
    rng = random.Random(seed)
    return [Request([rng.randrange(1, vocab) for _ in range(rng.randint(*prompt_len))], rng.randint(*new))
            for _ in range(n)]


def shared_prefix_workload(n: int, vocab: int, seed: int = 0, prefix_len: int = 192, unique=(8, 64),
                           new=(8, 128)) -> list[Request]:
    """Chat/agent-like traffic: every request = one common ``prefix_len``-token prefix (a system
    prompt, a document) + its own 8..64 tokens; greedy, no EOS. What prefix caching is for."""
    rng = random.Random(seed)
    prefix = [rng.randrange(1, vocab) for _ in range(prefix_len)]
    return [Request(prefix + [rng.randrange(1, vocab) for _ in range(rng.randint(*unique))], rng.randint(*new))
            for _ in range(n)]


SHARED_PREFIX = "shared-prefix"       # `--workload shared-prefix`: the built-in generated workload


def workload_from_file(path: Path, encode, default_new: int, max_len: int) -> list[Request]:
    """Prompts and max_new_tokens from a JSONL workload (sampling and arrivals ignored: greedy, all
    at t=0); every prompt checked to fit ``max_len`` (WorkloadError with file:line if not)."""
    from tinyllm.workload import load_workload, tokenize_checked
    items = load_workload(path)
    ids = tokenize_checked(items, path, encode, max_len, default_new)
    return [Request(p, it.max_new_tokens or default_new) for p, it in zip(ids, items)]


def parse_spec(spec: str) -> dict:
    """'layers=4,d_model=256,heads=4,kv_heads=2,vocab=4096' (any subset; the rest default)."""
    out = dict(RANDOM_DEFAULTS)
    if spec.strip() in ("", "default"):
        return out
    for part in spec.split(","):
        key, _, val = part.partition("=")
        key = key.strip()
        if key not in out or not val.strip().isdigit():
            raise ValueError(f"--random-model: bad item {part!r}; expected key=integer with keys "
                             f"{', '.join(RANDOM_DEFAULTS)}")
        out[key] = int(val)
    return out


def random_checkpoint(spec: str, out: Path, seed: int = 0) -> Path:
    """A seeded random Llama checkpoint on disk, so tinyllm and transformers load the same weights."""
    from tinyllm.model.checkpoint import save_checkpoint
    from tokenizers import Tokenizer, models
    s = parse_spec(spec)
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=s["vocab"], d_model=s["d_model"], n_layers=s["layers"], n_heads=s["heads"],
                      n_kv_heads=s["kv_heads"], d_ff=s["d_ff"], max_seq_len=s["max_seq_len"])
    model = Transformer(cfg)
    with torch.no_grad():                    # spread logits: greedy ties between paths are then negligible
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    out.mkdir(parents=True, exist_ok=True)
    Tokenizer(models.WordLevel({f"t{i}": i for i in range(cfg.vocab_size)}, unk_token="t0")).save(
        str(out / "tokenizer.json"))
    save_checkpoint(model, out)
    return out


# -- the paths ------------------------------------------------------------------------------------
def bench_solo(model, reqs: list[Request]) -> tuple[list[list[int]], dict]:
    t0 = time.perf_counter()
    outs, lat = [], []
    for r in reqs:
        t = time.perf_counter()
        outs.append(generate(model, r.prompt, r.max_new_tokens))
        lat.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    toks = sum(map(len, outs))
    return outs, {"requests": len(reqs), "wall_s": wall, "useful_tokens": toks, "tok_s": toks / wall,
                  "latency_p95_s": percentile(sorted(lat), 0.95), "row_util": 1.0}


def bench_transformers(ckpt: Path, reqs: list[Request], batch: int, device: str) -> tuple[list[list[int]], dict] | None:
    try:
        import transformers
    except ImportError:
        return None
    transformers.logging.set_verbosity_error()
    hf = transformers.LlamaForCausalLM.from_pretrained(ckpt, dtype=torch.float32).to(device).eval()
    outs: list[list[int]] = []
    lat = []
    t0 = time.perf_counter()
    with torch.no_grad():
        for b0 in range(0, len(reqs), batch):
            rs = reqs[b0:b0 + batch]
            L = max(len(r.prompt) for r in rs)
            ids = torch.tensor([[0] * (L - len(r.prompt)) + r.prompt for r in rs], device=device)
            mask = torch.tensor([[0] * (L - len(r.prompt)) + [1] * len(r.prompt) for r in rs], device=device)
            new = max(r.max_new_tokens for r in rs)
            gen = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, pad_token_id=0, eos_token_id=None)
            now = time.perf_counter() - t0
            for j, r in enumerate(rs):
                outs.append(gen[j, L:L + r.max_new_tokens].tolist())
                lat.append(now)
    wall = time.perf_counter() - t0
    toks = sum(r.max_new_tokens for r in reqs)
    return outs, {"requests": len(reqs), "wall_s": wall, "useful_tokens": toks, "tok_s": toks / wall,
                  "latency_p95_s": percentile(sorted(lat), 0.95)}


def warm_up(model, ckpt: Path | None, device: str) -> None:
    """First calls pay for allocator growth and lazy init; keep that out of the figures."""
    reqs = default_workload(4, model.cfg.vocab_size, seed=99, prompt_len=(4, 16), new=(4, 8))
    run_static(model, reqs, 4)
    run_continuous(model, reqs, 4)
    run_continuous(model, reqs, 4, kv="paged")
    run_continuous(model, reqs, 4, kv="paged", chunked_prefill=True)


# -- decode step anatomy --------------------------------------------------------------------------
def _timeit(fn, n: int) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn()
    sync()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t) / n


@torch.no_grad()
def matmul_only_s(model: Transformer, rows: int, n: int = 200) -> float:
    """Time of just the decode step's weight matmuls for ``rows`` rows (every Linear + lm_head)."""
    device = next(model.parameters()).device
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    xs = {w.shape[1]: torch.randn(rows, w.shape[1], device=device) for w in weights}

    def run():
        for w in weights:
            torch.mm(xs[w.shape[1]], w.t())
        if device.type == "cuda":
            torch.cuda.synchronize()
    return _timeit(run, n)


def peak_gflops(device: str, size: int = 1024, n: int = 20) -> float:
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)

    def run():
        torch.mm(a, b)
        if device == "cuda":
            torch.cuda.synchronize()
    return 2 * size ** 3 / _timeit(run, n) / 1e9


@contextmanager
def _wrapped(obj, name: str, wrap: Callable[[Callable], Callable]) -> Iterator[None]:
    """``obj.name`` replaced by ``wrap(obj.name)`` while inside, then put back as it was."""
    own = name in vars(obj)                      # a module global, or a method looked up on the class
    orig = getattr(obj, name)
    setattr(obj, name, wrap(orig))
    try:
        yield
    finally:
        if own:
            setattr(obj, name, orig)
        else:
            delattr(obj, name)


@contextmanager
def step_parts(eng: ContinuousEngine) -> Iterator[dict[str, float]]:
    """While inside: seconds the engine's steps spend in the model forward (or its CUDA-graph
    replay) and in sampling, summed. Timed inside the very steps whose total is timed, the parts
    are nested intervals of it and cannot add up to more than the step (timed on separate calls
    after the steps, at longer contexts, without the step's autocast, in another moment of a noisy
    machine, they used to exceed it). On CUDA each part is synchronized at both ends, so the
    kernels it queues are charged to it."""
    sync = torch.cuda.synchronize if eng.device.type == "cuda" else (lambda: None)
    spent = {"forward": 0.0, "sampling": 0.0}

    def timed(part: str) -> Callable[[Callable], Callable]:
        def wrap(fn: Callable) -> Callable:
            def run(*args, **kwargs):
                sync()
                t = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    sync()
                    spent[part] += time.perf_counter() - t
            return run
        return wrap

    forward = (eng.decoder, "step") if eng.decoder is not None else (eng.model, "forward")
    with _wrapped(*forward, timed("forward")), _wrapped(continuous, "sample_rows", timed("sampling")):
        yield spent


@torch.no_grad()
def decode_anatomy(model: Transformer, slots: int = 16, ctx: int = 96, n: int = 40, kv: str = "slots",
                   cuda_graph: bool = False) -> dict:
    """Where one decode step with every slot active goes (with cuda_graph: the graph-replayed step;
    kv="chunked": the token-budget scheduler's step, all rows decoding, one ragged forward), as the
    mean of ``n`` steps: forward + sampling + other = step, where other (scheduling, KV
    bookkeeping, Python) is the remainder of the same steps."""
    vocab = model.cfg.vocab_size
    chunked = kv == "chunked"
    eng = ContinuousEngine(model, slots, max_len=min(model.cfg.max_seq_len, ctx + n + 8),
                           kv="paged" if chunked else kv, cuda_graph=cuda_graph, chunked_prefill=chunked,
                           max_batched_tokens=max(slots, ctx * slots) if chunked else None)
    rng = random.Random(1)
    for _ in range(slots):
        eng.add_request(Request([rng.randrange(1, vocab) for _ in range(ctx)], n + 4))
    eng.step()                                                    # admit (and prefill) everyone
    assert sum(eng.slots.active) == slots
    eng.step()                                                    # a first decode step, not counted
    sync = torch.cuda.synchronize if eng.device.type == "cuda" else (lambda: None)
    step_s = 0.0
    with step_parts(eng) as parts:
        for _ in range(n):
            sync()
            t = time.perf_counter()
            eng.step()
            sync()
            step_s += time.perf_counter() - t
    step_s, fwd_s, sample_s = step_s / n, parts["forward"] / n, parts["sampling"] / n
    mm_s = matmul_only_s(model, slots)
    return {"active_rows": slots, "context": ctx, "steps": n, "step_ms": step_s * 1e3, "forward_ms": fwd_s * 1e3,
            "sampling_ms": sample_s * 1e3, "other_ms": max(0.0, step_s - fwd_s - sample_s) * 1e3,
            "matmul_only_ms": mm_s * 1e3, "step_over_matmul": step_s / mm_s,
            "matmul_gflops": 2 * slots * sum(m.weight.numel() for m in model.modules()
                                             if isinstance(m, torch.nn.Linear)) / mm_s / 1e9}


class BenchProgress:
    """Where a bench run is. In a terminal: rich's transient bar, gone before the report. Piped (CI,
    `| tee`), where that bar shows nothing until the end, one plain line on stderr as each stage
    starts and as it ends, with its figure: a long run shows it is alive, stdout stays the report."""

    def __init__(self, console: Console, stages: int, lines: bool) -> None:
        self.stages, self.n, self.stage, self.t0 = stages, 0, "", 0.0
        self.bar = None
        if not lines:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
            self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                                console=console, transient=True)
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


# -- the command ----------------------------------------------------------------------------------
def run_bench(args) -> dict:
    from rich.console import Console

    from tinyllm.model.checkpoint import default_model_dir, load_checkpoint

    # Piped or redirected (CI, `| tee`), rich would squeeze the table to 80 columns and cut every
    # figure; there, print at the width the content needs instead.
    console = Console() if sys.stdout.isatty() else Console(width=WIDE_CONSOLE)
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    tmp = None
    if args.random_model is not None:
        tmp = tempfile.TemporaryDirectory()
        ckpt = random_checkpoint(args.random_model, Path(tmp.name) / "random")
        model_name = f"random Llama ({args.random_model or 'default'})"
    else:
        ckpt = Path(args.model) if args.model else default_model_dir()
        model_name = str(args.model) if args.model else "bundled Shakespeare"
    model, tok = load_checkpoint(ckpt, device=device)
    max_len = min(model.cfg.max_seq_len, 512)
    if args.workload == SHARED_PREFIX:
        reqs = shared_prefix_workload(args.requests, model.cfg.vocab_size, seed=args.seed)
        wl_desc = f"{args.requests} requests, a shared 192-token prefix + 8..64 own tokens, new 8..128, greedy"
    elif args.workload:
        reqs = workload_from_file(resolve_workload(args.workload), tok.encode, 64, max_len)
        wl_desc = f"{args.workload} ({len(reqs)} requests, greedy)"
    else:
        reqs = default_workload(args.requests, model.cfg.vocab_size, seed=args.seed)
        wl_desc = f"{args.requests} requests, prompts 8..64, new 8..128, greedy, seed {args.seed}"
        for i, r in enumerate(reqs):
            try:
                check_fits(len(r.prompt), r.max_new_tokens, max_len, "the bench's context")
            except ContextTooLong as e:
                raise ValueError(f"workload request {i}: {e}") from None

    results: dict[str, dict] = {}
    outputs: dict[str, list[list[int]]] = {}
    kvs = ["slots", "paged", "chunked", "chunked-nocache"] if args.kv == "all" else [args.kv]
    paths = (["solo", "static"] + [f"continuous-{k}" for k in kvs]
             + ([] if args.no_transformers else ["transformers"]))
    with BenchProgress(console, len(paths) + 2, lines=not sys.stdout.isatty()) as progress:
        progress.start("warm-up")
        warm_up(model, ckpt, device)
        progress.done()
        sample = reqs[:args.solo_sample]
        for path in paths:
            progress.start(path)
            if path == "solo":
                outputs[path], results[path] = bench_solo(model, sample)
            elif path == "static":
                res, results[path] = run_static(model, reqs, args.batch)
                outputs[path] = [r.tokens for r in res]
            elif path.startswith("continuous"):
                kind = path.removeprefix("continuous-")
                chunked = (dict(chunked_prefill=True, max_batched_tokens=args.max_batched_tokens,
                                prefix_cache=kind == "chunked") if kind.startswith("chunked") else {})
                res, results[path] = run_continuous(model, reqs, args.slots, max_len=max_len,
                                                    kv="paged" if chunked else kind, **chunked)
                outputs[path] = [r.tokens for r in res]
            else:
                got = bench_transformers(ckpt, reqs, args.batch, device)
                if got is None:
                    console.print("[yellow]transformers is not installed: its row is skipped[/]")
                    progress.done("skipped")
                    continue
                outputs[path], results[path] = got
            progress.done(f"{results[path]['tok_s']:.0f} tok/s")
        progress.start("decode-step anatomy")
        anatomy = decode_anatomy(model, slots=args.slots)
        anatomy_chunked = decode_anatomy(model, slots=args.slots, kv="chunked") if "chunked" in kvs else None
        graph = None
        if device == "cuda":                       # eager vs CUDA-graph decode step (issue 7)
            graph = decode_anatomy(model, slots=args.slots, cuda_graph=True)
        limit_gflops = peak_gflops(device)
        progress.done(f"{anatomy['step_ms']:.2f} ms per decode step")
    if tmp is not None:
        tmp.cleanup()

    # agreement: every tinyllm path equals solo on the sample, and each other on everything
    agree = {}
    ref = outputs["static"]
    for path, outs in outputs.items():
        if path == "solo":
            agree[path] = sum(a == b for a, b in zip(outs, ref[:len(outs)])) / len(outs)
        else:
            agree[path] = sum(a == b for a, b in zip(outs, ref)) / len(ref)
    tinyllm_ok = all(agree[p] == 1.0 for p in outputs if p != "transformers")

    report = {
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "device": device,
                    "torch": torch.__version__, "peak_matmul_gflops_1024": limit_gflops},
        "model": {"name": model_name, "params": model.num_params(), "config": model.cfg.__dict__},
        "workload": wl_desc, "slots": args.slots, "batch": args.batch,
        "paths": results, "greedy_agreement_vs_static": agree, "tinyllm_paths_agree": tinyllm_ok,
        "decode_step": anatomy,
        "decode_step_chunked": anatomy_chunked,
        "decode_step_cuda_graph": graph,
    }
    print_report(console, report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=float) + "\n")
        console.print(f"wrote {args.json}")
    if not tinyllm_ok:
        raise RuntimeError(f"greedy outputs disagree between tinyllm paths: {agree}")
    return report


COLUMNS = ("tok/s", "x static", "TTFT p50", "TTFT p95", "latency p95", "row util", "KV reserved MiB",
           "KV used mean", "used/alloc", "preempt", "prefill tok", "greedy =")


def path_cells(report: dict) -> dict[str, dict[str, str]]:
    """Each path's figures as printed, by column."""
    static = report["paths"]["static"]["tok_s"]

    def f(x, fmt: str = "{:.2f}") -> str:
        return "—" if x is None else fmt.format(x)
    return {name: dict(zip(COLUMNS, (
        f(s["tok_s"], "{:.0f}"), f(s["tok_s"] / static, "{:.2f}x"), f(s.get("ttft_p50_s"), "{:.2f}s"),
        f(s.get("ttft_p95_s"), "{:.2f}s"), f(s.get("latency_p95_s"), "{:.2f}s"), f(s.get("row_util"), "{:.0%}"),
        f(s.get("kv_reserved_mib"), "{:.1f}"), f(s.get("kv_used_mean"), "{:.0%}"),
        f(s.get("kv_alloc_used_mean"), "{:.0%}"), f(s.get("preemptions"), "{}"),
        f(s.get("prefill_tokens_computed"), "{:,}"), f(report["greedy_agreement_vs_static"].get(name), "{:.0%}"))))
        for name, s in report["paths"].items()}


def _table(cells: dict[str, dict[str, str]], columns: list[str]) -> Table:
    from rich.table import Table
    t = Table()
    t.add_column("path", no_wrap=True, min_width=max(map(len, cells)))
    for col in columns:
        t.add_column(col, justify="right", overflow="fold")
    for name, row in cells.items():
        t.add_row(name, *(row[c] for c in columns))
    return t


def path_tables(console: Console, report: dict) -> list[Table]:
    """The paths' figures in as few tables as fit the console, each led by the whole path name.
    Squeezed into one table, rich cuts the names (six rows of `conti…`) and the figures; here a
    column that would not fit starts the next table instead."""
    cells = path_cells(report)
    unbounded = console.options.update_width(10_000)
    groups: list[list[str]] = [[]]
    for col in COLUMNS:
        if groups[-1] and console.measure(_table(cells, groups[-1] + [col]), options=unbounded).maximum > console.width:
            groups.append([])
        groups[-1].append(col)
    return [_table(cells, g) for g in groups]


def print_report(console: Console, report: dict) -> None:
    paths = report["paths"]
    console.print(f"[bold]tinyllm bench[/] — {report['model']['name']} ({report['model']['params'] / 1e6:.1f}M params), "
                  f"{report['workload']}, {report['slots']} slots / batch {report['batch']}, "
                  f"{report['machine']['device']} × {report['machine']['torch_threads']} threads")
    for t in path_tables(console, report):
        console.print(t)
    name_w = max(map(len, paths))              # every bar starts in the same column, whatever the names
    width = max(10, min(40, console.width - name_w - 12))
    top = max(s["tok_s"] for s in paths.values())
    console.print("[bold]tokens/s per path[/]")
    for name, s in paths.items():
        n = max(1, round(width * s["tok_s"] / top)) if s["tok_s"] > 0 else 0
        console.print(f"  {name:<{name_w}}  {'█' * n}{' ' * (width - n)} {s['tok_s']:.0f}")
    for key, what in (("decode_step", "decode step (slot KV)"), ("decode_step_chunked", "chunked step, all decoding")):
        a = report.get(key)
        if not a:
            continue
        console.print(
            f"[bold]{what}, {a['active_rows']} active rows, context ~{a['context']}[/]: {a['step_ms']:.2f} ms = "
            f"forward {a['forward_ms']:.2f} + sampling {a['sampling_ms']:.2f} + other {a['other_ms']:.2f} ms "
            f"(mean of {a['steps']} steps); the same rows' matmuls alone: {a['matmul_only_ms']:.2f} ms "
            f"({a['matmul_gflops']:.1f} GFLOP/s) → step = {a['step_over_matmul']:.2f}x the matmul-only time.")
    console.print("(forward: the model call; sampling: choosing each row's next token; other: the rest of the "
                  "same steps — scheduling, KV bookkeeping, Python.)")
    console.print(f"Peak 1024² matmul: {report['machine']['peak_matmul_gflops_1024']:.0f} GFLOP/s.")
    a = report["decode_step"]
    g = report.get("decode_step_cuda_graph")
    if g:
        console.print(f"[bold]CUDA graph decode step[/]: {g['step_ms']:.2f} ms vs eager {a['step_ms']:.2f} ms "
                      f"({a['step_ms'] / g['step_ms']:.2f}x)")


def add_bench_parser(sub) -> None:
    from tinyllm.args import positive_int
    b = sub.add_parser("bench", help="compare solo, static, continuous (slots/paged) and transformers")
    src = b.add_mutually_exclusive_group()
    src.add_argument("--model", metavar="DIR", help="checkpoint directory (default: the bundled model)")
    src.add_argument("--random-model", nargs="?", const="", metavar="SPEC",
                     help="a seeded random Llama: e.g. layers=4,d_model=256,heads=4,kv_heads=2,vocab=4096 (the default)")
    b.add_argument("--workload", metavar="FILE|NAME",
                    help="a JSONL prompt file or a bundled workload's name (greedy, all at t=0), or "
                         f"'{SHARED_PREFIX}': {{--requests}} requests sharing a 192-token prefix")
    b.add_argument("--requests", type=positive_int, default=64, metavar="N", help="seeded default workload size (64)")
    b.add_argument("--slots", type=positive_int, default=16, metavar="N")
    b.add_argument("--batch", type=positive_int, default=16, metavar="N", help="static / transformers batch size")
    b.add_argument("--kv", choices=["slots", "paged", "chunked", "chunked-nocache", "all"], default="all",
                   help="continuous path(s) to run: slot KV, paged KV, paged KV with the token-budget "
                        "scheduler (chunked prefill) and prefix caching, the same without the cache, or all (default)")
    b.add_argument("--max-batched-tokens", type=positive_int, default=DEFAULT_MAX_BATCHED_TOKENS, metavar="N",
                   help=f"the chunked path's token budget per step (default {DEFAULT_MAX_BATCHED_TOKENS})")
    b.add_argument("--device", choices=["cpu", "cuda"], default=None)
    b.add_argument("--threads", type=positive_int, default=2, metavar="N", help="torch CPU threads (default 2)")
    b.add_argument("--solo-sample", type=positive_int, default=8, metavar="N", help="requests run solo (default 8)")
    b.add_argument("--no-transformers", action="store_true", help="skip the transformers comparison")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--json", metavar="OUT", help="also write the figures as JSON")
    b.set_defaults(fn=_cmd_bench)


def _cmd_bench(args) -> None:
    from tinyllm.model.checkpoint import CheckpointError
    from tinyllm.args import UsageError
    try:
        run_bench(args)
    except (ValueError, CheckpointError) as e:
        raise UsageError(str(e)) from None
