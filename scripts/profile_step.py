"""Where a decode step and a mixed step go: the token-budget engine's steps under torch's profiler,
at a given number of running sequences, on the bundled model or a --random-model.

    python scripts/profile_step.py --rows 16 64 [--random-model] [--mixed] [--top 25]

A decode step: every sequence decoding (context ~96). A mixed step: the same, plus one 128-token
prefill chunk per step (a newcomer's prompt). Prints the profiler's table (self CPU time by op)
and the step against its matmul-only time (docs/speed.md reads these).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from tinyllm.bench.anatomy import matmul_only_s
from tinyllm.bench.workloads import random_checkpoint
from tinyllm.engine import ContinuousEngine, Request
from tinyllm.model.checkpoint import load_checkpoint


def engine_at(model, rows: int, ctx: int, steps: int, mixed: bool) -> ContinuousEngine:
    """A token-budget engine with ``rows`` sequences admitted and decoding (plus waiting newcomers
    with 128-token prompts when ``mixed``: one prefill chunk joins each step)."""
    vocab = model.cfg.vocab_size
    rng = random.Random(1)
    eng = ContinuousEngine(model, rows + (1 if mixed else 0), max_len=min(model.cfg.max_seq_len, 512),
                           kv="paged", chunked_prefill=True, max_batched_tokens=max(rows * ctx, rows + 128),
                           prefix_cache=False)
    for _ in range(rows):
        eng.add_request(Request([rng.randrange(1, vocab) for _ in range(ctx)], steps * 2 + 8))
    eng.step()
    eng.step()
    if mixed:
        eng.max_batched_tokens = eng.scheduler.max_batched_tokens = rows + 128
        for _ in range(steps + 4):
            eng.add_request(Request([rng.randrange(1, vocab) for _ in range(128)], 1))
        eng.step()
    return eng


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[16, 64])
    p.add_argument("--random-model", action="store_true")
    p.add_argument("--mixed", action="store_true")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = random_checkpoint("", Path(tmp) / "m") if a.random_model else None
        model, _ = load_checkpoint(ckpt)
    for rows in a.rows:
        eng = engine_at(model, rows, 96, a.steps, a.mixed)
        t = time.perf_counter()
        for _ in range(a.steps):
            eng.step()
        step = (time.perf_counter() - t) / a.steps
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(a.steps):
                eng.step()
        mm = matmul_only_s(model, rows + (128 if a.mixed else 0))     # every token of the step through every matmul
        kind = "mixed (+128-token chunk)" if a.mixed else "decode"
        print(f"\n== {kind} step, {rows} rows: {step * 1e3:.2f} ms; matmul-only {mm * 1e3:.2f} ms "
              f"-> {step / mm:.2f}x")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.top))


if __name__ == "__main__":
    main()
