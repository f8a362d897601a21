"""A vLLM-compatible server's ``/metrics``, read with prometheus_client's parser, as the figures
the app shows: requests running / waiting, KV cache usage, preemptions, prefix-cache hit rate,
token rates, TTFT / inter-token latency quantiles.

Counters and histograms are cumulative since the server started, so rates and quantiles are
taken over a window (the difference between two scrapes ``WINDOW_S`` apart): they show what the
server does now, not its lifetime average. Quantiles are interpolated inside histogram buckets,
as Prometheus' ``histogram_quantile`` does. No torch, no textual.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

WINDOW_S = 10.0
HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
}
COUNTERS = {
    "preemptions": "vllm:num_preemptions",
    "prompt_tokens": "vllm:prompt_tokens",
    "generation_tokens": "vllm:generation_tokens",
    "prefix_queries": "vllm:prefix_cache_queries",
    "prefix_hits": "vllm:prefix_cache_hits",
    "spec_drafts": "vllm:spec_decode_num_drafts",
    "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "spec_accepted": "vllm:spec_decode_num_accepted_tokens",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"  # by its position label


class MetricsError(ValueError):
    """The text is not Prometheus metrics from a vLLM-compatible server."""


@dataclass(frozen=True)
class Scrape:
    """One /metrics read, summed over label sets (one model per server)."""

    at: float
    gauges: dict[str, float]
    counters: dict[str, float]
    buckets: dict[str, tuple[tuple[float, float], ...]]  # name → ((le, cumulative count), ...)
    info: dict[str, str] = field(default_factory=dict)  # vllm:cache_config_info labels
    model: str | None = None
    per_pos: dict[int, float] = field(default_factory=dict)  # speculation: accepted tokens by draft position


def parse(text: str, at: float | None = None) -> Scrape:
    """Parse Prometheus text; MetricsError if it has no vllm: metrics (or is not metrics at all)."""
    gauges: dict[str, float] = {}
    counters: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    info: dict[str, str] = {}
    per_pos: dict[int, float] = {}
    model = None
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as e:
        raise MetricsError(f"not Prometheus metrics ({e})") from None
    for fam in families:
        if not fam.name.startswith("vllm:"):
            continue
        for s in fam.samples:
            model = model or s.labels.get("model_name")
            if fam.name == "vllm:cache_config_info":
                info.update(s.labels)
            elif fam.type == "histogram" and s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                b = buckets.setdefault(fam.name, {})
                b[le] = b.get(le, 0.0) + s.value
            elif fam.name == PER_POS and s.name.endswith("_total") and s.labels.get("position", "").isdigit():
                pos = int(s.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + s.value
            elif fam.type == "counter" and s.name.endswith("_total"):
                counters[fam.name] = counters.get(fam.name, 0.0) + s.value
            elif fam.type == "gauge":
                gauges[fam.name] = gauges.get(fam.name, 0.0) + s.value
    if not (gauges or counters or buckets):
        raise MetricsError("no vllm: metrics in it (is this a vLLM server?)")
    return Scrape(
        time.monotonic() if at is None else at,
        gauges,
        counters,
        {k: tuple(sorted(v.items())) for k, v in buckets.items()},
        info,
        model,
        per_pos,
    )


def quantile(q: float, buckets: tuple[tuple[float, float], ...]) -> float | None:
    """The q-quantile of a cumulative histogram, interpolated linearly inside its bucket
    (Prometheus' histogram_quantile). None when it counted nothing."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if le == float("inf"):
                return prev_le  # above the last finite bound: its bound
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def _minus(a: tuple[tuple[float, float], ...], b: tuple[tuple[float, float], ...] | None):
    if not b:
        return a
    old = dict(b)
    return tuple((le, c - old.get(le, 0.0)) for le, c in a)


@dataclass(frozen=True)
class ServerFigures:
    """What the app shows for a server that only exposes metrics."""

    model: str | None = None
    running: float = 0
    waiting: float = 0
    kv_usage: float = 0.0  # 0..1, vllm:kv_cache_usage_perc
    preemptions: float = 0  # since the server started
    preemptions_recent: float = 0  # in the window
    prefix_hit_rate: float | None = None  # in the window (None: nothing queried)
    prompt_tps: float = 0.0
    generation_tps: float = 0.0
    ttft: tuple[float | None, float | None] = (None, None)  # p50, p95 seconds, in the window
    itl: tuple[float | None, float | None] = (None, None)
    e2e: tuple[float | None, float | None] = (None, None)
    block_size: int | None = None
    num_blocks: int | None = None
    window_s: float = 0.0
    cache_dtype: str = ""  # as the server was configured ("auto", "fp8", ...)
    spec_drafts: float = 0  # speculative decoding: drafts since the server started (0: none)
    spec_acceptance: float | None = None  # draft tokens kept, in the window (None: no draft there)
    spec_per_pos: tuple[float, ...] = ()  # in the window: accepted at each position over drafts (vLLM's rate)


class MetricsWindow:
    """Scrapes in, figures out: keeps the scrapes of the last WINDOW_S to difference against."""

    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = window_s
        self._scrapes: deque[Scrape] = deque()

    def add(self, s: Scrape) -> ServerFigures:
        last = self._scrapes[-1] if self._scrapes else None
        if last is not None and any(v < last.counters.get(k, 0.0) for k, v in s.counters.items()):
            self._scrapes.clear()  # a counter went down: the server restarted
        self._scrapes.append(s)
        while len(self._scrapes) > 2 and s.at - self._scrapes[1].at >= self.window_s:
            self._scrapes.popleft()
        old = self._scrapes[0] if len(self._scrapes) > 1 else None
        dt = s.at - old.at if old is not None else 0.0

        def delta(key: str) -> float:
            name = COUNTERS[key]
            return s.counters.get(name, 0.0) - (old.counters.get(name, 0.0) if old else 0.0)

        def quantiles(key: str):
            name = HISTOGRAMS[key]
            b = _minus(s.buckets.get(name, ()), old.buckets.get(name) if old else None)
            return quantile(0.5, b), quantile(0.95, b)

        queries = delta("prefix_queries")
        drafts, draft_tokens = delta("spec_drafts"), delta("spec_draft_tokens")
        before = old.per_pos if old else {}
        per_pos = tuple((s.per_pos[i] - before.get(i, 0.0)) / drafts if drafts > 0 else 0.0 for i in sorted(s.per_pos))
        g = s.gauges
        return ServerFigures(
            model=s.model,
            running=g.get("vllm:num_requests_running", 0),
            waiting=g.get("vllm:num_requests_waiting", 0),
            kv_usage=g.get("vllm:kv_cache_usage_perc", 0.0),
            preemptions=s.counters.get(COUNTERS["preemptions"], 0),
            preemptions_recent=delta("preemptions") if old else 0,
            prefix_hit_rate=delta("prefix_hits") / queries if queries > 0 else None,
            prompt_tps=delta("prompt_tokens") / dt if dt > 0 else 0.0,
            generation_tps=delta("generation_tokens") / dt if dt > 0 else 0.0,
            ttft=quantiles("ttft"),
            itl=quantiles("itl"),
            e2e=quantiles("e2e"),
            block_size=_int(s.info.get("block_size")),
            num_blocks=_int(s.info.get("num_gpu_blocks")),
            window_s=dt,
            cache_dtype=s.info.get("cache_dtype", ""),
            spec_drafts=s.counters.get(COUNTERS["spec_drafts"], 0),
            spec_acceptance=delta("spec_accepted") / draft_tokens if draft_tokens > 0 else None,
            spec_per_pos=per_pos if drafts > 0 else (),
        )


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v not in (None, "", "None") else None
    except ValueError:
        return None
