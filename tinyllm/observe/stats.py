"""Run statistics and percentiles: plain Python, no torch (the app's counters use them too)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tinyllm.request import Result


@dataclass
class Stats:
    wall_s: float = 0.0
    useful_tokens: int = 0  # generated tokens that belong to a finished request
    decode_steps: int = 0
    computed_rows: int = 0  # rows run through decode (incl. finished rows / free slots)
    useful_rows: int = 0  # rows whose output was kept
    kv_reserved_tokens: int = 0  # KV capacity held (max over the run)
    kv_used_frac: list[float] = field(default_factory=list)  # per decode step: real tokens / capacity
    kv_alloc_frac: list[float] = field(default_factory=list)  # per decode step: real tokens / claimed
    kv_used_tokens: list[int] = field(default_factory=list)  # per decode step: real tokens held
    kv_bytes_per_token: int = 0
    preemptions: int = 0
    peak_active: int = 0
    kv_allocated_at_end: int = 0  # leak check: must be 0 once every request is done
    prefix_cache_queries: int = 0  # context tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, served from cached blocks (not computed)
    prefill_tokens: int = 0  # context tokens run through the model before sampling
    # (prompts, recomputes; static: padding included)
    spec_drafts: int = 0  # speculation (vLLM's spec_decode_num_drafts): drafts verified
    spec_draft_tokens: int = 0  # their tokens (spec_decode_num_draft_tokens)
    spec_accepted_tokens: int = 0  # of those, accepted (spec_decode_num_accepted_tokens)
    spec_accepted_per_pos: list[int] = field(default_factory=list)  # per draft position, accepted

    def summary(self, results: list[Result]) -> dict:
        lat = sorted(r.latency_s for r in results)
        ttft = sorted(r.ttft_s for r in results)
        return {
            "requests": len(results),
            "wall_s": self.wall_s,
            "useful_tokens": self.useful_tokens,
            "tok_s": self.useful_tokens / self.wall_s if self.wall_s > 0 else 0.0,
            "decode_steps": self.decode_steps,
            "row_util": self.useful_rows / max(1, self.computed_rows),
            "latency_mean_s": sum(lat) / max(1, len(lat)),
            "latency_p95_s": percentile(lat, 0.95),
            "ttft_mean_s": sum(ttft) / max(1, len(ttft)),
            "ttft_p50_s": percentile(ttft, 0.50),
            "ttft_p95_s": percentile(ttft, 0.95),
            "kv_reserved_mib": self.kv_reserved_tokens * self.kv_bytes_per_token / 2**20,
            "kv_used_mean": sum(self.kv_used_frac) / max(1, len(self.kv_used_frac)),
            "kv_used_mib_mean": (
                sum(self.kv_used_tokens) / max(1, len(self.kv_used_tokens)) * self.kv_bytes_per_token / 2**20
            ),
            "kv_used_peak": max(self.kv_used_frac, default=0.0),
            "kv_alloc_used_mean": (sum(self.kv_alloc_frac) / len(self.kv_alloc_frac) if self.kv_alloc_frac else None),
            "preemptions": self.preemptions,
            "peak_active": self.peak_active,
            "kv_allocated_at_end": self.kv_allocated_at_end,
            "prefill_tokens_computed": self.prefill_tokens,
            "prefix_cache_queries": self.prefix_cache_queries,
            "prefix_cache_hits": self.prefix_cache_hits,
            "spec_drafts": self.spec_drafts,
            "spec_draft_tokens": self.spec_draft_tokens,
            "spec_accepted_tokens": self.spec_accepted_tokens,
        }


def percentile(sorted_xs: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 when empty)."""
    if not sorted_xs:
        return 0.0
    return sorted_xs[min(len(sorted_xs) - 1, max(0, math.ceil(q * len(sorted_xs)) - 1))]
