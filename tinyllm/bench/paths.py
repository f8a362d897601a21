"""The baseline paths the bench runs beside the engine's: each request solo (``generate``),
and Hugging Face ``transformers`` on the same checkpoint in padded static batches; and the
warm-up that keeps first-call costs out of every figure."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from tinyllm.bench.workloads import default_workload
from tinyllm.engine import Request, percentile, run_continuous, run_static
from tinyllm.engine.solo import generate


def figures(requests: int, wall_s: float, tokens: int, latencies: list[float]) -> dict:
    """A baseline path's figures, under the names the engine's paths report them by."""
    return {
        "requests": requests,
        "wall_s": wall_s,
        "useful_tokens": tokens,
        "tok_s": tokens / wall_s,
        "latency_p95_s": percentile(sorted(latencies), 0.95),
    }


def bench_solo(model, reqs: list[Request], kv_cache_dtype: str = "auto") -> tuple[list[list[int]], dict]:
    t0 = time.perf_counter()
    outs, lat = [], []
    for r in reqs:
        t = time.perf_counter()
        outs.append(generate(model, r.prompt, r.max_new_tokens, kv_cache_dtype=kv_cache_dtype))
        lat.append(time.perf_counter() - t)
    return outs, dict(figures(len(reqs), time.perf_counter() - t0, sum(map(len, outs)), lat), row_util=1.0)


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
            rs = reqs[b0 : b0 + batch]
            L = max(len(r.prompt) for r in rs)
            ids = torch.tensor([[0] * (L - len(r.prompt)) + r.prompt for r in rs], device=device)
            mask = torch.tensor([[0] * (L - len(r.prompt)) + [1] * len(r.prompt) for r in rs], device=device)
            new = max(r.max_new_tokens for r in rs)
            gen = hf.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=None,
            )
            now = time.perf_counter() - t0
            for j, r in enumerate(rs):
                outs.append(gen[j, L : L + r.max_new_tokens].tolist())
                lat.append(now)
    return outs, figures(len(reqs), time.perf_counter() - t0, sum(r.max_new_tokens for r in reqs), lat)


def warm_up(model, ckpt: Path | None, device: str) -> None:
    """First calls pay for allocator growth and lazy init; keep that out of the figures."""
    reqs = default_workload(4, model.cfg.vocab_size, seed=99, prompt_len=(4, 16), new=(4, 8))
    run_static(model, reqs, 4)
    run_continuous(model, reqs, 4)
    run_continuous(model, reqs, 4, kv="paged")
    run_continuous(model, reqs, 4, kv="paged", chunked_prefill=True)
