"""Prefill-only runs A/B inside one process: the C kernel for the prefill chunks' attention
(every token one row, ``native.decode_attention``) against PyTorch's gather + SDPA per chunk,
alternating whole runs of the same requests (each max_new_tokens 1: no decode rows).

    python scripts/prefill_ab.py --model DIR|bundled --prompt 480 --requests 8 --budget 512

Prints the median (and worst) time per variant over --rounds rounds.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from tinyllm import native
from tinyllm.engine import ContinuousEngine, Request
from tinyllm.model.checkpoint import load_checkpoint


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="bundled")
    p.add_argument("--prompt", type=int, default=128, help="tokens per prompt")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--budget", type=int, default=256, help="max_batched_tokens (tokens per step)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model, _ = load_checkpoint(None if a.model == "bundled" else a.model)
    rng = random.Random(0)
    prompts = [[rng.randrange(1, model.cfg.vocab_size) for _ in range(a.prompt)] for _ in range(a.requests)]
    usable = native.usable
    times: dict[str, list[float]] = {"kernel": [], "sdpa": []}
    for _ in range(a.rounds):
        for v, ts in times.items():
            native.usable = usable if v == "kernel" else (lambda *args: False)
            eng = ContinuousEngine(model, max_len=512, kv="paged", chunked_prefill=True, max_batched_tokens=a.budget,
                                   kv_memory_mib=64, max_num_seqs=64)
            for prompt in prompts:
                eng.add_request(Request(prompt, 1))
            t = time.perf_counter()
            while eng.has_work():
                eng.step()
            ts.append(time.perf_counter() - t)
    native.usable = usable
    print(a.model, f"prompt {a.prompt} x {a.requests}, budget {a.budget}:",
          "  ".join(f"{v} {statistics.median(ts) * 1e3:.0f} ms (worst {max(ts) * 1e3:.0f})" for v, ts in times.items()))


if __name__ == "__main__":
    main()
