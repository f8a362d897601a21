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
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tinyllm.model.device import resolve_device
from tinyllm.engine import (DEFAULT_MAX_BATCHED_TOKENS, Request, percentile, run_continuous,
                            run_static)
from tinyllm.engine.generate import generate
from tinyllm.args import add_policy_arg
from tinyllm.request import ContextTooLong, check_fits
from tinyllm.workload import resolve_workload
from tinyllm.bench.anatomy import decode_anatomy, peak_gflops
from tinyllm.bench.report import WIDE_CONSOLE, BenchProgress, print_report
from tinyllm.bench.workloads import (SHARED_PREFIX, default_workload, random_checkpoint, shared_prefix_workload,
                                     workload_from_file)

if TYPE_CHECKING:
    pass



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
                                                    kv="paged" if chunked else kind,
                                                    scheduling_policy=args.scheduling_policy, **chunked)
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
    add_policy_arg(b)
    b.add_argument("--json", metavar="OUT", help="also write the figures as JSON")
    b.set_defaults(fn=_cmd_bench)


def _cmd_bench(args) -> None:
    from tinyllm.model.checkpoint import CheckpointError
    from tinyllm.args import UsageError
    try:
        run_bench(args)
    except (ValueError, CheckpointError) as e:
        raise UsageError(str(e)) from None
