"""One measurement for docs/speed.md: the token-budget path (chunked prefill, paged KV) on the
bench's default workload at N running sequences, and its decode step against the matmul floor.
Uses only APIs that the tree before issue 22 has too, so the same script measures both trees:

    PYTHONPATH=/path/to/tree python scripts/speed_compare.py --model DIR --seqs 16 --label after

Prints one JSON line: tok/s, the chunked decode step (ms), its matmul-only time (ms), the peak
1024² matmul GFLOP/s and the share of the compute roofline (2 x params x tok/s over that peak).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from tinyllm.bench import default_workload, warm_up
from tinyllm.bench.anatomy import decode_anatomy, peak_gflops
from tinyllm.engine import run_continuous
from tinyllm.model.checkpoint import load_checkpoint


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    p.add_argument("--seqs", type=int, required=True)
    p.add_argument("--label", default="")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kv-memory", type=float, default=None, metavar="MiB",
                   help="size the pool by KV memory, --seqs then caps the running sequences (max_num_seqs); "
                        "for the comparison with scripts/vllm_bench.py --kv-memory")
    p.add_argument("--budget", type=int, default=None,
                   help="token budget per step (max_batched_tokens; default max(256, --seqs)); vLLM-CPU's own "
                        "default for the LLM class is 4096")
    p.add_argument("--no-anatomy", action="store_true", help="only the run, not the decode step taken apart")
    p.add_argument("--kv-cache-dtype", default=None, help="the engine's kv_cache_dtype (auto, float32, bfloat16); "
                   "not given: the engine's default (a tree before the option has none)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model, _ = load_checkpoint(a.model)
    warm_up(model, None, "cpu")
    reqs = default_workload(64, model.cfg.vocab_size, seed=0)
    t = time.perf_counter()
    size = {"kv_memory_mib": a.kv_memory, "max_num_seqs": a.seqs} if a.kv_memory else {"n_slots": a.seqs}
    dtype = {"kv_cache_dtype": a.kv_cache_dtype} if a.kv_cache_dtype else {}
    size.update(dtype)
    _, st = run_continuous(model, reqs, max_len=512, kv="paged", chunked_prefill=True,
                           max_batched_tokens=a.budget or max(256, a.seqs), **size)
    wall = time.perf_counter() - t
    if a.no_anatomy:
        print(json.dumps({"label": a.label, "model": a.model or "bundled", "seqs": a.seqs, "kv_memory_mib": a.kv_memory,
                          "kv_cache_dtype": a.kv_cache_dtype or "auto",
                          "budget": a.budget or max(256, a.seqs), "tok_s": round(st["tok_s"], 1), "wall_s": round(wall, 2)}), flush=True)
        return
    step = decode_anatomy(model, slots=a.seqs, kv="chunked", **dtype)
    peak = peak_gflops("cpu")
    tok_s = st["tok_s"]
    print(json.dumps({"label": a.label, "model": a.model or "bundled", "seqs": a.seqs, "tok_s": round(tok_s, 1),
                      "kv_memory_mib": a.kv_memory, "kv_cache_dtype": a.kv_cache_dtype or "auto",
                      "wall_s": round(wall, 2), "step_ms": round(step["step_ms"], 3),
                      "forward_ms": round(step["forward_ms"], 3), "matmul_only_ms": round(step["matmul_only_ms"], 3),
                      "step_over_matmul": round(step["step_over_matmul"], 2), "peak_gflops": round(peak, 1),
                      "roofline": round(2 * model.num_params() * tok_s / 1e9 / peak, 4)}), flush=True)


if __name__ == "__main__":
    main()
