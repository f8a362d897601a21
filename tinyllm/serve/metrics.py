"""Prometheus metrics with vLLM's names and meanings, fed by a step hook in the engine thread.

vLLM's names, so dashboards and alerts written for a vLLM server read this one unchanged
(prometheus_client appends ``_total`` to counters, which is what vLLM exposes). The registry is
this object's own, not prometheus_client's global one: several servers (tests) can live in one
process, and nothing else a process imports leaks into ``/metrics``.

Everything is updated in the engine thread from what each step reports (token events and
lifecycle events), so a scrape never touches the engine; prometheus_client is thread-safe.
Times are the engine clock's (``engine.now()``), the clock the lifecycle events carry.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tinyllm.observe.snapshot import FORK_OF, LifecycleEvent
from tinyllm.slo import SLO, judge, tpot

__all__ = ["CONTENT_TYPE_LATEST", "FINISHED_REASONS", "ServeMetrics"]

# vLLM's finished_reason label values: EOS, max_tokens, client gone / aborted, engine failure.
FINISHED_REASONS = ("stop", "length", "abort", "error")

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py).
# fmt: off
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)
REQUEST_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)
# fmt: on


# The gauges and counters with only the model_name label, vLLM's names and help (the "vllm:" prefix
# added): (attribute, kind, name, help).
SERIES = (
    ("running", Gauge, "num_requests_running", "Requests in the model's running batch (holding a slot)."),
    ("waiting", Gauge, "num_requests_waiting", "Requests waiting for a slot (preempted ones included)."),
    (
        "kv_usage",
        Gauge,
        "kv_cache_usage_perc",
        "KV-cache usage: allocated / reserved tokens, 0..1 (1 = every block claimed).",
    ),
    ("preemptions", Counter, "num_preemptions", "Requests preempted (out of KV blocks), cumulative."),
    ("prompt_tokens", Counter, "prompt_tokens", "Prompt tokens of requests whose prefill completed."),
    ("generation_tokens", Counter, "generation_tokens", "Tokens generated."),
    ("prefix_queries", Counter, "prefix_cache_queries", "Context tokens looked up in the prefix cache."),
    ("prefix_hits", Counter, "prefix_cache_hits", "Of those, tokens served from cached blocks."),
    ("spec_drafts", Counter, "spec_decode_num_drafts", "Speculative drafts verified (n-gram prompt lookup)."),
    ("spec_draft_tokens", Counter, "spec_decode_num_draft_tokens", "Tokens of those drafts."),
    ("spec_accepted", Counter, "spec_decode_num_accepted_tokens", "Draft tokens accepted."),
)

# The histograms, vLLM's names and help (the "vllm:" prefix added): (attribute, name, help, buckets;
# None: per-request token counts, 1-2-5 buckets up to the context). The per-finished-request
# phases as vLLM's output processor records them (vllm/v1/metrics/stats.py).
HISTOGRAMS = (
    ("ttft", "time_to_first_token_seconds", "Arrival to first generated token.", TTFT_BUCKETS),
    ("itl", "inter_token_latency_seconds", "Time between two tokens of one request.", ITL_BUCKETS),
    ("e2e", "e2e_request_latency_seconds", "Arrival to last token, finished requests.", REQUEST_BUCKETS),
    ("queue_time", "request_queue_time_seconds", "Arrival to first admission into a slot.", REQUEST_BUCKETS),
    *(
        (
            f"{phase}_time",
            f"request_{phase}_time_seconds",
            f"{span} ({label} phase), finished requests.",
            REQUEST_BUCKETS,
        )
        for phase, label, span in (
            ("prefill", "PREFILL", "First admission to first token"),
            ("decode", "DECODE", "First token to last token"),
            ("inference", "RUNNING", "First admission to last token"),
        )
    ),
    ("request_prompt_tokens", "request_prompt_tokens", "Prompt tokens, finished requests.", None),
    ("request_generation_tokens", "request_generation_tokens", "Generated tokens, finished requests.", None),
    (
        "max_generation_tokens",
        "request_max_num_generation_tokens",
        "Per finished request, the most tokens any of its sequences generated (one sequence per request "
        "here: its generated tokens).",
        None,
    ),
)


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's buckets for per-request token counts)."""
    out, exp = [], 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > max_value:
                return tuple(out)
            out.append(v)
        exp += 1


@dataclass
class _Times:
    """One unfinished request's times on the engine clock."""

    arrival: float
    prompt_tokens: int
    admitted: bool = False
    admitted_at: float = 0.0  # its first admission: queue time ends, prefill time starts
    first_token_at: float = 0.0
    tokens: int = 0
    last_token: float = 0.0
    first_token: bool = False  # it has one (first_token_at is its time)


class ServeMetrics:
    """The server's metrics. ``on_step`` is a StepHook (engine thread); ``render()`` is the
    text a scrape returns (any thread)."""

    def __init__(self, model_name: str, max_model_len: int = 4096, slo: SLO | None = None):
        self.model_name = model_name
        self.slo = slo  # --slo: count the finished requests that met it, and those that missed it by reason
        self.registry = r = CollectorRegistry(auto_describe=True)
        m = ["model_name"]
        for attr, kind, name, doc in SERIES:  # each with this server's model_name label
            setattr(self, attr, kind(f"vllm:{name}", doc, m, registry=r).labels(model_name))
        success = Counter(
            "vllm:request_success",
            "Requests ended, by finished_reason (stop: EOS, length: max_tokens, abort: cancelled, error: failed).",
            m + ["finished_reason"],
            registry=r,
        )
        self.success = {why: success.labels(model_name, why) for why in FINISHED_REASONS}

        tokens = build_1_2_5_buckets(max_model_len)
        for attr, name, doc, buckets in HISTOGRAMS:  # each with this server's model_name label
            buckets = tokens if buckets is None else buckets
            setattr(self, attr, Histogram(f"vllm:{name}", doc, m, buckets=buckets, registry=r).labels(model_name))
        self._cache_info = Gauge(
            "vllm:cache_config_info",
            "Information of the KV cache configuration (value 1).",
            m + ["block_size", "num_gpu_blocks", "enable_prefix_caching", "cache_dtype"],
            registry=r,
        )
        self.spec_per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, by their position in the draft (0: the first).",
            m + ["position"],
            registry=r,
        )
        self._spec_seen = (0, 0, 0, [])  # the engine's spec counters at the last step (counted in deltas)
        self._reqs: dict[int, _Times] = {}
        if slo is not None:  # tinyllm's own names (vLLM has no such counter), only with --slo
            self.slo_met = Counter(
                "tinyllm:requests_slo_met",
                f"Finished requests that met the SLO ({slo}): TTFT and time per output token after the first.",
                m,
                registry=r,
            ).labels(model_name)
            self.slo_missed = Counter(
                "tinyllm:requests_slo_missed",
                f"Finished requests that missed the SLO ({slo}), by the reason they waited most steps for "
                "(queue, slots, pool, budget, preempted; none: it never waited).",
                m + ["reason"],
                registry=r,
            )

    def set_cache_config(self, engine) -> None:
        """``vllm:cache_config_info``: the pool's block size and block count (a slot cache counts
        as one block of max_len per slot), and the KV cache dtype as configured (vLLM's "auto" too)."""
        slots = engine.slots
        paged = engine.kv_kind == "paged"
        block_size = slots.block_size if paged else engine.max_len
        n_blocks = slots.n_blocks if paged else engine.n_slots
        self._cache_info.labels(
            self.model_name,
            str(block_size),
            str(n_blocks),
            str(bool(engine.prefix_cache)),
            getattr(engine, "kv_cache_dtype", "auto"),
        ).set(1)
        self._gauges(engine)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- the step hook (engine thread) ----------------------------------------------------------
    def on_step(self, engine, token_events: list, lifecycle_events: list[LifecycleEvent]) -> None:
        now = engine.now()
        reqs = self._reqs
        for ev in lifecycle_events:
            t = reqs.get(ev.rid)
            if ev.kind == "queued":
                reqs[ev.rid] = _Times(ev.time_s, ev.tokens)
            elif ev.kind == "preempted":
                self.preemptions.inc()
            elif t is None:
                continue
            elif ev.kind == "admitted":
                if not t.admitted:
                    t.admitted, t.admitted_at = True, ev.time_s
                    self.queue_time.observe(max(0.0, ev.time_s - t.arrival))
                if engine.prefix_cache and not ev.reason.startswith(FORK_OF):  # a fork looked nothing up
                    self.prefix_queries.inc(ev.tokens)
                    self.prefix_hits.inc(ev.cached)
            elif ev.kind == "first_token":
                self.ttft.observe(max(0.0, ev.time_s - t.arrival))
                self.prompt_tokens.inc(t.prompt_tokens)
                t.first_token_at, t.first_token = ev.time_s, True
            elif ev.kind == "finished":
                self.e2e.observe(max(0.0, ev.time_s - t.arrival))
                self._finished(t, ev)
                self.success["length" if ev.reason == "length" else "stop"].inc()  # eos, stop
                if self.slo is not None:
                    self._judge(engine, t, ev)
            elif ev.kind in ("aborted", "failed"):
                self.success["abort" if ev.kind == "aborted" else "error"].inc()
                del reqs[ev.rid]
        self.generation_tokens.inc(len(token_events))
        for ev in token_events:
            t = reqs.get(ev.rid)
            if t is None:
                continue
            t.tokens += 1
            if t.tokens > 1:  # the first token's time came above
                self.itl.observe(max(0.0, now - t.last_token))
            t.last_token = now
            if ev.done:
                del reqs[ev.rid]
        self._gauges(engine)
        self._speculation(engine.stats)

    def _speculation(self, st) -> None:
        """vLLM's spec_decode counters, from the engine's (engine/speculate.py) since the last step."""
        drafts, tokens, accepted, per_pos = self._spec_seen
        if st.spec_drafts == drafts:
            return
        self.spec_drafts.inc(st.spec_drafts - drafts)
        self.spec_draft_tokens.inc(st.spec_draft_tokens - tokens)
        self.spec_accepted.inc(st.spec_accepted_tokens - accepted)
        for i, n in enumerate(st.spec_accepted_per_pos):
            seen = per_pos[i] if i < len(per_pos) else 0
            if n > seen:
                self.spec_per_pos.labels(self.model_name, str(i)).inc(n - seen)
        self._spec_seen = (
            st.spec_drafts,
            st.spec_draft_tokens,
            st.spec_accepted_tokens,
            list(st.spec_accepted_per_pos),
        )

    def _finished(self, t: _Times, ev: LifecycleEvent) -> None:
        """vLLM's per-request histograms, observed once the request finished (``ev.tokens``: its
        generated tokens)."""
        self.prefill_time.observe(max(0.0, t.first_token_at - t.admitted_at))
        self.decode_time.observe(max(0.0, ev.time_s - t.first_token_at))
        self.inference_time.observe(max(0.0, ev.time_s - t.admitted_at))
        self.request_prompt_tokens.observe(t.prompt_tokens)
        self.request_generation_tokens.observe(ev.tokens)
        self.max_generation_tokens.observe(ev.tokens)

    def _judge(self, engine, t: _Times, ev: LifecycleEvent) -> None:
        """Count a finished request against the SLO (aborted and failed ones are neither met nor
        missed: vllm:request_success counts them)."""
        first = t.first_token_at if t.first_token else None
        ttft = None if first is None else max(0.0, first - t.arrival)
        v = judge(self.slo, ttft, tpot(first, ev.time_s, ev.tokens), engine.waited(ev.rid))
        if v.met:
            self.slo_met.inc()
        else:
            self.slo_missed.labels(self.model_name, v.reason or "none").inc()

    def _gauges(self, engine) -> None:
        waiting, running = engine.load()
        self.waiting.set(waiting)
        self.running.set(running)
        self.kv_usage.set(engine.slots.allocated_tokens() / max(1, engine.slots.reserved_tokens()))
