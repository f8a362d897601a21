"""`tinyllm bench`: one seeded workload through every path, with the figures users choose by.

Paths: solo ``generate`` (a sample), ``run_static``, ``run_continuous`` with slot and paged KV,
and ``transformers`` ``generate`` on the same checkpoint in padded static batches (when
installed). Greedy outputs are checked to agree before any figure is printed. Then a decode
step with every slot active is taken apart: model forward vs sampling vs bookkeeping, against
the time the same rows' matmuls alone take on this machine (the practical limit).
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from tinyllm.config import ModelConfig
from tinyllm.device import resolve_device
from tinyllm.engine import (DEFAULT_MAX_BATCHED_TOKENS, ContinuousEngine, Request, percentile, run_continuous,
                            run_static)
from tinyllm.engine.ragged import RaggedAttention
from tinyllm.engine.sampler import sample_rows
from tinyllm.generate import generate
from tinyllm.model import Transformer
from tinyllm.request import ContextTooLong, check_fits
from tinyllm.workload import resolve_workload

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
    from tinyllm.checkpoint import save_checkpoint
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


@torch.no_grad()
def decode_anatomy(model: Transformer, slots: int = 16, ctx: int = 96, n: int = 40, kv: str = "slots",
                   cuda_graph: bool = False) -> dict:
    """Where one decode step with every slot active goes (with cuda_graph: the graph-replayed step;
    kv="chunked": the token-budget scheduler's step, all rows decoding, one ragged forward)."""
    vocab = model.cfg.vocab_size
    chunked = kv == "chunked"
    eng = ContinuousEngine(model, slots, max_len=min(model.cfg.max_seq_len, ctx + 3 * n + 8),
                           kv="paged" if chunked else kv, cuda_graph=cuda_graph, chunked_prefill=chunked,
                           max_batched_tokens=max(slots, ctx * slots) if chunked else None)
    rng = random.Random(1)
    for _ in range(slots):
        eng.add_request(Request([rng.randrange(1, vocab) for _ in range(ctx)], 3 * n + 4))
    eng.step()                                                    # admit (and prefill) everyone
    assert sum(eng.slots.active) == slots
    step_s = _timeit(eng.step, n)
    cache = eng.slots
    if chunked:                                                   # the same decode batch, forward only
        items = [(q.slot, q.computed, 1) for q in eng._running]
        for slot, start, _ in items:
            cache.try_grow(slot, start + 1)
        idx = torch.tensor([[q.context()[-1] for q in eng._running]], device=eng.device)
        at = torch.arange(slots, device=eng.device)
        fwd_s = _timeit(lambda: model(idx, cache=RaggedAttention(cache, items), logits_at=at), n)
    else:
        last = eng._last_tok
        if kv == "paged":
            cache.reserve_step()
        fwd_s = _timeit(lambda: model(last, cache=cache), n)
    logits = torch.randn(slots, vocab)
    rows = [eng.sampling] * slots
    sample_s = _timeit(lambda: sample_rows(logits, rows), n)
    mm_s = matmul_only_s(model, slots)
    return {"active_rows": slots, "context": ctx, "step_ms": step_s * 1e3, "forward_ms": fwd_s * 1e3,
            "sampling_ms": sample_s * 1e3, "bookkeeping_ms": max(0.0, step_s - fwd_s - sample_s) * 1e3,
            "matmul_only_ms": mm_s * 1e3, "step_over_matmul": step_s / mm_s,
            "matmul_gflops": 2 * slots * sum(m.weight.numel() for m in model.modules()
                                             if isinstance(m, torch.nn.Linear)) / mm_s / 1e9}


# -- the command ----------------------------------------------------------------------------------
def run_bench(args) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from tinyllm.checkpoint import default_model_dir, load_checkpoint

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
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task("warm-up", total=len(paths) + 1)
        warm_up(model, ckpt, device)
        progress.advance(task)
        sample = reqs[:args.solo_sample]
        for path in paths:
            progress.update(task, description=path)
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
                    continue
                outputs[path], results[path] = got
            progress.advance(task)
        progress.update(task, description="decode-step anatomy")
        anatomy = decode_anatomy(model, slots=args.slots)
        anatomy_chunked = decode_anatomy(model, slots=args.slots, kv="chunked") if "chunked" in kvs else None
        graph = None
        if device == "cuda":                       # eager vs CUDA-graph decode step (issue 7)
            graph = decode_anatomy(model, slots=args.slots, cuda_graph=True)
        limit_gflops = peak_gflops(device)
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


def print_report(console, report: dict) -> None:
    from rich.table import Table
    paths = report["paths"]
    static = paths["static"]["tok_s"]
    console.print(f"[bold]tinyllm bench[/] — {report['model']['name']} ({report['model']['params'] / 1e6:.1f}M params), "
                  f"{report['workload']}, {report['slots']} slots / batch {report['batch']}, "
                  f"{report['machine']['device']} × {report['machine']['torch_threads']} threads")
    t = Table()
    for col in ("path", "tok/s", "x static", "TTFT p50", "TTFT p95", "latency p95", "row util",
                "KV reserved MiB", "KV used mean", "used/alloc", "preempt", "prefill tok", "greedy =", ):
        t.add_column(col, justify="right" if col != "path" else "left")

    def f(x, fmt="{:.2f}"):
        return "—" if x is None else fmt.format(x)
    for name, s in paths.items():
        t.add_row(name, f(s["tok_s"], "{:.0f}"), f(s["tok_s"] / static, "{:.2f}x"), f(s.get("ttft_p50_s"), "{:.2f}s"),
                  f(s.get("ttft_p95_s"), "{:.2f}s"), f(s.get("latency_p95_s"), "{:.2f}s"),
                  f(s.get("row_util"), "{:.0%}"), f(s.get("kv_reserved_mib"), "{:.1f}"),
                  f(s.get("kv_used_mean"), "{:.0%}"), f(s.get("kv_alloc_used_mean"), "{:.0%}"),
                  f(s.get("preemptions"), "{}"), f(s.get("prefill_tokens_computed"), "{:,}"),
                  f(report["greedy_agreement_vs_static"].get(name), "{:.0%}"))
    console.print(t)
    width = 40
    top = max(s["tok_s"] for s in paths.values())
    console.print("[bold]tokens/s per path[/]")
    for name, s in paths.items():
        n = round(width * s["tok_s"] / top)
        console.print(f"  {name:<19} {'█' * n}{' ' * (width - n)} {s['tok_s']:.0f}")
    for key, what in (("decode_step", "decode step (slot KV)"), ("decode_step_chunked", "chunked step, all decoding")):
        a = report.get(key)
        if not a:
            continue
        console.print(
            f"[bold]{what}, {a['active_rows']} active rows, context ~{a['context']}[/]: {a['step_ms']:.2f} ms = "
            f"forward {a['forward_ms']:.2f} + sampling {a['sampling_ms']:.2f} + scheduling/bookkeeping "
            f"{a['bookkeeping_ms']:.2f} ms; the same rows' matmuls alone: {a['matmul_only_ms']:.2f} ms "
            f"({a['matmul_gflops']:.1f} GFLOP/s) → step = {a['step_over_matmul']:.2f}x the matmul-only time.")
    console.print(f"Peak 1024² matmul: {report['machine']['peak_matmul_gflops_1024']:.0f} GFLOP/s.")
    a = report["decode_step"]
    g = report.get("decode_step_cuda_graph")
    if g:
        console.print(f"[bold]CUDA graph decode step[/]: {g['step_ms']:.2f} ms vs eager {a['step_ms']:.2f} ms "
                      f"({a['step_ms'] / g['step_ms']:.2f}x)")


def add_bench_parser(sub) -> None:
    from tinyllm.cli import positive_int
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
    from tinyllm.checkpoint import CheckpointError
    from tinyllm.cli import UsageError
    try:
        run_bench(args)
    except (ValueError, CheckpointError) as e:
        raise UsageError(str(e)) from None
