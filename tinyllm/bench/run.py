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
from pathlib import Path

import torch

from tinyllm import machine, native
from tinyllm.bench import quiet
from tinyllm.bench.anatomy import decode_anatomy, peak_gflops
from tinyllm.bench.goodput import path_slo, request_slos
from tinyllm.bench.paths import bench_solo, bench_transformers, warm_up
from tinyllm.bench.report import BenchProgress, print_report, stdout_console
from tinyllm.bench.workloads import (
    LONG_TAIL,
    LONG_TAIL_CAPS,
    SHARED_PREFIX,
    default_workload,
    line_slos,
    long_tail_cap,
    long_tail_workload,
    random_checkpoint,
    shared_prefix_workload,
    workload_from_file,
)
from tinyllm.engine import kv_bytes_per_token, run_continuous, run_static
from tinyllm.engine.build import (
    MIB,
    check_budget_covers,
    check_kv_fits,
    engine_config,
    resolve_concurrency,
    rows_for_budget,
)
from tinyllm.engine.forward import kernels_for, kv_cache_dtype, kv_cache_dtype_name
from tinyllm.model.config import default_kv_blocks
from tinyllm.model.device import resolve_device
from tinyllm.request import ContextTooLong, check_fits
from tinyllm.units import count
from tinyllm.workload import NEW_TOKENS, WorkloadError, resolve_workload

# -- equal memory, equal slots ---------------------------------------------------------------------
BLOCK_SIZE = 16  # the paged paths' block size (the engine's default)


def path_settings(path: str, mode: str, args, budget_mib: float, max_len: int) -> dict:
    """How ``path`` runs in a table. "memory" (the headline): every path at the same KV budget, so
    static and the slot engine get the rows of max_len it buys and the paged paths the blocks it
    buys, run by up to --max-num-seqs sequences. "slots": every path at --slots rows (static at
    --batch), the paged pool as large as the slots' memory: the scheduler alone."""
    if path == "static":
        return (
            {"batch": args.batch}
            if mode == "slots"
            else {"batch": min(args.max_num_seqs, rows_for_budget(budget_mib, max_len, args.bytes_per_token))}
        )
    kind = path.removeprefix("continuous-")
    out: dict = dict(
        kv="paged" if kind != "slots" else "slots",
        max_len=max_len,
        scheduling_policy=args.scheduling_policy,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    if kind.startswith("chunked"):
        out.update(chunked_prefill=True, max_batched_tokens=args.max_batched_tokens, prefix_cache=kind == "chunked")
        out.update(getattr(args, "speculative_config", None) or {})  # --speculative-config: the token-budget paths
    if mode == "memory":
        out.update(kv_memory_mib=budget_mib, max_num_seqs=args.max_num_seqs)
    else:
        out.update(n_slots=args.slots)
    return out


def concurrency(settings: dict, bytes_per_token: int) -> tuple[int, int | None]:
    """(rows or sequences at most, paged blocks or None): two settings that agree run alike."""
    if "batch" in settings:
        return settings["batch"], None
    config, _ = engine_config(
        None, settings.get("n_slots"), None, {k: v for k, v in settings.items() if k != "n_slots"}
    )
    n, blocks = resolve_concurrency(config, settings["max_len"], bytes_per_token)
    if settings["kv"] == "paged" and blocks is None:
        blocks = default_kv_blocks(n, settings["max_len"], BLOCK_SIZE)
    return n, blocks


# -- the command ----------------------------------------------------------------------------------
BF16_NOTE = (
    "at bfloat16 K/V the runs on PyTorch's attention (solo generate; every path without the C "
    "kernels) can pick other tokens late in a run (rounding turns float noise into bfloat16 steps), "
    'so the "greedy =" column, each path against static, may be below 100%'
)
CHECKED = "; the runs on the batch-invariant C kernels were checked to agree with each other: {}"
UNCHECKED = "; fewer than two runs on the batch-invariant kernels here, so no path's tokens were checked"


def agreement(
    outputs: dict[str, list[list[int]]], bf16_on_cpu: bool, c_kernels: bool = True
) -> tuple[dict[str, float], bool, str | None]:
    """Each run's share of requests whose greedy tokens equal static's (solo: on its sample),
    whether the runs that must agree do, and a note when some differ as they may.

    Every run must agree with every other, except transformers (another implementation) and, at
    bfloat16 K/V on CPU, the runs on PyTorch's attention: rounding K/V to bfloat16 turns the float
    noise between batch shapes into whole bfloat16 steps now and then, so those may pick other
    tokens late in a long run. On the C kernels (``c_kernels``: every tinyllm path runs them, one
    forward) each token is computed the same in any batch, so every tinyllm path but solo
    generate must still agree with the others; on PyTorch's ragged attention only the
    token-budget runs are held to it (with fewer than two such runs nothing is checked, and the
    note says so)."""
    ref = outputs["static (memory)"]
    agree = {run: sum(a == b for a, b in zip(outs, ref)) / len(outs) for run, outs in outputs.items()}
    ok = all(agree[p] == 1.0 for p in outputs if p != "transformers")
    if not bf16_on_cpu or ok:
        return agree, ok, None
    if c_kernels:
        exact = [run for run in outputs if run not in ("solo", "transformers")]
    else:
        exact = [run for run in outputs if run.startswith("continuous-chunked")]
    if len(exact) < 2:
        return agree, True, BF16_NOTE + UNCHECKED
    if not all(outputs[run] == outputs[exact[0]] for run in exact):
        return agree, False, None
    return agree, True, BF16_NOTE + CHECKED.format(", ".join(exact))


def run_bench(args) -> dict:
    from tinyllm.model.checkpoint import default_model_dir, load_checkpoint

    # Piped or redirected (CI, `| tee`), rich would squeeze the table to 80 columns and cut every
    # figure; there, print at the width the content needs instead.
    console = stdout_console()
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
    own: list = []  # a workload file's lines' own SLOs
    if args.workload and long_tail_cap(args.workload):
        cap = long_tail_cap(args.workload)
        reqs = long_tail_workload(args.requests, model.cfg.vocab_size, cap, seed=args.seed)
        wl_desc = (
            f"long-tail: {count(args.requests, 'request')}, prompts 112..128, new ~ exponential (mean 128) capped "
            f"at {cap}, EOS ignored, greedy, seed {args.seed}"
        )
    elif args.workload == SHARED_PREFIX:
        reqs = shared_prefix_workload(args.requests, model.cfg.vocab_size, seed=args.seed)
        wl_desc = f"{count(args.requests, 'request')}, a shared 192-token prefix + 8..64 own tokens, new 8..128, greedy"
    elif args.workload:
        try:
            path = resolve_workload(args.workload)
        except WorkloadError as e:  # the bench's own seeded workloads are names too
            raise ValueError(
                f"--workload {e}; or the bench's own: {SHARED_PREFIX}, {LONG_TAIL}[-CAP] "
                f"(CAP {' / '.join(map(str, LONG_TAIL_CAPS))})"
            ) from None
        reqs = workload_from_file(path, tok.encode, NEW_TOKENS, max_len)
        own = line_slos(path)
        wl_desc = f"{args.workload} ({len(reqs)} requests, greedy)"
    else:
        reqs = default_workload(args.requests, model.cfg.vocab_size, seed=args.seed)
        wl_desc = f"{count(args.requests, 'request')}, prompts 8..64, new 8..128, greedy, seed {args.seed}"
        for i, r in enumerate(reqs):
            try:
                check_fits(len(r.prompt), r.max_new_tokens, max_len, "the bench's context")
            except ContextTooLong as e:
                raise ValueError(f"workload request {i}: {e}") from None

    slos = request_slos(args.slo, own or [None] * len(reqs))  # each request's: a line's own, else --slo
    args.bytes_per_token = bpt = kv_bytes_per_token(model, torch.device(device), args.kv_cache_dtype)
    budget_mib = args.kv_memory if args.kv_memory is not None else args.slots * max_len * bpt / MIB
    check_kv_fits(budget_mib, device, "--kv-memory")  # before anything runs: each path allocates it
    if args.paths in ("chunked", "chunked-nocache", "all"):
        try:
            check_budget_covers(args.max_batched_tokens, max(args.max_num_seqs, args.slots))
        except ValueError:
            raise ValueError(
                f"--max-batched-tokens {args.max_batched_tokens} is less than the "
                f"{max(args.max_num_seqs, args.slots)} sequences the token-budget paths may run "
                f"(--max-num-seqs {args.max_num_seqs}, --slots {args.slots}): every running request "
                f"decodes one token per step, so the budget must cover them all"
            ) from None
    results: dict[str, dict] = {}  # at equal KV memory (the headline)
    equal_slots: dict[str, dict] = {}  # at equal slots
    outputs: dict[str, list[list[int]]] = {}
    kvs = ["slots", "paged", "chunked", "chunked-nocache"] if args.paths == "all" else [args.paths]
    tinyllm_paths = ["static"] + [f"continuous-{k}" for k in kvs]
    runs = [(p, "memory") for p in tinyllm_paths]
    runs += [
        (p, "slots")
        for p in tinyllm_paths
        if concurrency(path_settings(p, "slots", args, budget_mib, max_len), bpt)
        != concurrency(path_settings(p, "memory", args, budget_mib, max_len), bpt)
    ]
    stages = ["solo"] + [p if m == "memory" else f"{p} at {args.slots} slots" for p, m in runs]
    stages += [] if args.no_transformers else ["transformers"]
    started = quiet.read()  # how busy the rest of the machine keeps it
    with BenchProgress(console, len(stages) + 2, lines=not sys.stdout.isatty()) as progress:
        progress.start("warm-up")
        warm_up(model, ckpt, device)
        progress.done()
        progress.start("solo")
        outputs["solo"], results["solo"] = bench_solo(model, reqs[: args.solo_sample], args.kv_cache_dtype)
        progress.done(f"{results['solo']['tok_s']:.0f} tok/s")
        for (path, mode), stage in zip(runs, stages[1:]):
            progress.start(stage)
            kw = path_settings(path, mode, args, budget_mib, max_len)
            seqs, blocks = concurrency(kw, bpt)
            if path == "static":
                res, fig = run_static(model, reqs, kw["batch"], kv_cache_dtype=args.kv_cache_dtype)
            else:
                res, fig = run_continuous(model, reqs, **kw)
            fig.update(seqs=seqs, kv_blocks=blocks)
            if any(slos):
                fig["slo"] = path_slo(res, slos, fig["wall_s"])
            (results if mode == "memory" else equal_slots)[path] = fig
            outputs[f"{path} ({mode})"] = [r.tokens for r in res]
            progress.done(f"{fig['tok_s']:.0f} tok/s")
        equal_slots = {p: equal_slots.get(p, results[p]) for p in tinyllm_paths}  # same settings: one run
        if not args.no_transformers:
            progress.start("transformers")
            got = bench_transformers(ckpt, reqs, args.batch, device)
            if got is None:
                console.print("[yellow]transformers is not installed: its row is skipped[/]")
                progress.done("skipped")
            else:
                outputs["transformers"], equal_slots["transformers"] = got
                equal_slots["transformers"]["seqs"] = args.batch
                progress.done(f"{equal_slots['transformers']['tok_s']:.0f} tok/s")
        progress.start("decode-step anatomy")
        kv_dtype = args.kv_cache_dtype
        anatomy = decode_anatomy(model, slots=args.slots, kv_cache_dtype=kv_dtype)
        anatomy_chunked = (
            decode_anatomy(model, slots=args.slots, kv="chunked", kv_cache_dtype=kv_dtype) if "chunked" in kvs else None
        )
        wide = min(args.max_num_seqs, len(reqs))
        anatomy_wide = (
            decode_anatomy(model, slots=wide, kv="chunked", kv_cache_dtype=kv_dtype)
            if "chunked" in kvs and wide != args.slots
            else None
        )
        graph = None
        if torch.device(device).type == "cuda":  # eager vs CUDA-graph decode step (issue 7)
            graph = decode_anatomy(model, slots=args.slots, cuda_graph=True, kv_cache_dtype=kv_dtype)
        limit_gflops = peak_gflops(device)
        progress.done(f"{anatomy['step_ms']:.2f} ms per decode step")
    busy_elsewhere = quiet.others_share(started, quiet.read())
    if tmp is not None:
        tmp.cleanup()

    kv_dtype_ = kv_cache_dtype(device, args.kv_cache_dtype)
    agree, tinyllm_ok, note = agreement(
        outputs, kv_dtype_ == torch.bfloat16 and device == "cpu", kernels_for(device, kv_dtype_) == "C kernels"
    )
    for table in (results, equal_slots):  # per path as printed: its run in that table
        for path, fig in table.items():
            runs_of = [agree[k] for k in (path, f"{path} (memory)", f"{path} (slots)") if k in agree]
            fig["greedy_agree"] = min(runs_of) if runs_of else None

    report = {
        "machine": {
            "platform": platform.platform(),
            "processor": machine.cpu_name(),
            "cpu_count": os.cpu_count(),  # (the busy-machine share is of the whole host: /proc/stat)
            "torch_threads": torch.get_num_threads(),
            "device": device,
            "torch": torch.__version__,
            "peak_matmul_gflops_1024": limit_gflops,
            "paged_decode_attention": native.describe(),
            "others_cpu_share": busy_elsewhere,
        },
        "model": {"name": model_name, "params": model.num_params(), "config": model.cfg.__dict__},
        "workload": wl_desc,
        "kernels": kernels_for(device, kv_cache_dtype(device, args.kv_cache_dtype)),  # every tinyllm path's
        "slo": None if args.slo is None else str(args.slo),  # (a workload line's own: per request)
        "slo_judged": any(slos),
        "speculative": getattr(args, "speculative_config", None) or None,  # the engine settings it gave
        "slots": args.slots,
        "batch": args.batch,
        "memory": {
            "kv_memory_mib": budget_mib,
            "max_len": max_len,
            "bytes_per_token": bpt,
            "kv_cache_dtype": kv_cache_dtype_name(device, args.kv_cache_dtype),
            "max_num_seqs": args.max_num_seqs,
            "block_size": BLOCK_SIZE,
            "rows": min(args.max_num_seqs, rows_for_budget(budget_mib, max_len, bpt)),
            "blocks": int(budget_mib * MIB // (BLOCK_SIZE * bpt)),
        },
        "paths": results,
        "paths_equal_slots": equal_slots,
        "greedy_agreement_vs_static": agree,
        "tinyllm_paths_agree": tinyllm_ok,
        "agreement_note": note,
        "decode_step": anatomy,
        "decode_step_chunked": anatomy_chunked,
        "decode_step_chunked_wide": anatomy_wide,
        "decode_step_cuda_graph": graph,
    }
    print_report(console, report)
    if args.json:
        from tinyllm.observe.recording import write_text

        write_text(args.json, json.dumps(report, indent=2, default=float) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)  # stdout stays the report alone
    if not tinyllm_ok:
        raise RuntimeError(
            f"greedy outputs disagree between tinyllm paths (the share of requests equal to static's, per run): {agree}"
        )
    return report
