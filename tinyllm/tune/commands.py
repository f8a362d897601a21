"""The winner as command lines: ``tinyllm serve`` options and vLLM flags, with notes where a
setting does not map one to one, and what of the answer transfers to another machine."""

from __future__ import annotations

import json
import shlex

from tinyllm.config import EngineConfig
from tinyllm.tune.space import Point

TRANSFER = (
    "What transfers to another machine: the decisions (the same requests admitted, chunked, preempted "
    "and queued the same way for the same KV memory). What does not: the step cost, which this "
    "machine's cost profile priced; load one measured there with --cost-profile FILE to rank for it."
)


def serve_command(p: Point, kv_mib: float, max_len: int | None, model: str | None) -> str:
    """The winner as ``tinyllm serve`` options (the server always runs chunked prefill)."""
    args = ["tinyllm", "serve"]
    if model:
        args += ["--model", model]
    args += ["--kv-memory", f"{kv_mib:g}", "--max-num-seqs", str(p.max_num_seqs)]
    if max_len:
        args += ["--max-len", str(max_len)]
    if p.chunked_prefill:
        args += ["--max-batched-tokens", str(p.max_batched_tokens)]
        args += [] if p.prefix_cache else ["--no-prefix-cache"]
    args += ["--block-size", str(p.block_size), "--scheduling-policy", p.scheduling_policy]
    if p.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", p.kv_cache_dtype]
    return shlex.join(args + speculative_flag(p))


def speculative_flag(p: Point) -> list[str]:
    """vLLM's --speculative-config for a speculating point (both servers take the same JSON)."""
    if not p.num_speculative_tokens:
        return []
    spec = {  # the lookup sizes and batch threshold tuned with, spelled out: vLLM's defaults differ
        "method": "ngram",
        "num_speculative_tokens": p.num_speculative_tokens,
        "prompt_lookup_max": EngineConfig.prompt_lookup_max,
        "prompt_lookup_min": EngineConfig.prompt_lookup_min,
        "disable_by_batch_size": EngineConfig.speculative_disable_by_batch_size,
    }
    return ["--speculative-config", json.dumps(spec)]


def vllm_command(p: Point) -> tuple[str, list[str]]:
    """The winner as vLLM flags, and notes on those that do not map one to one."""
    args = ["vllm", "serve", "MODEL", "--max-num-seqs", str(p.max_num_seqs)]
    notes = []
    if p.chunked_prefill:
        args += ["--enable-chunked-prefill", "--max-num-batched-tokens", str(p.max_batched_tokens)]
        args += ["--enable-prefix-caching" if p.prefix_cache else "--no-enable-prefix-caching"]
    else:
        args += ["--no-enable-chunked-prefill", "--no-enable-prefix-caching"]
        notes.append("without chunked prefill vLLM needs --max-num-batched-tokens >= --max-model-len")
    args += ["--block-size", str(p.block_size)]
    if p.scheduling_policy in ("fcfs", "priority"):
        args += ["--scheduling-policy", p.scheduling_policy]
    else:
        notes.append(f"vLLM has no {p.scheduling_policy} policy (fcfs, priority): the nearest is fcfs")
    if p.kv_cache_dtype == "bfloat16":
        notes.append(
            "KV bfloat16 here halves float32; on a GPU vLLM's auto is already 16-bit, and halving that again is "
            "--kv-cache-dtype fp8"
        )
    args += speculative_flag(p)
    notes.append("the KV memory is --gpu-memory-utilization's share (or --kv-cache-memory-bytes where vLLM has it)")
    return shlex.join(args), notes


def commands(s, p: Point) -> tuple[str | None, str, list[str]]:
    """The point as ``tinyllm serve`` (None without chunked prefill) and vLLM command lines, and
    the notes on what does not map."""
    serve = serve_command(p, s.kv_mib, s.args.max_len, s.args.model) if p.chunked_prefill else None
    return (serve, *vllm_command(p))
