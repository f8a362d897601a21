"""Immutable views of the engine's state, for viewers (the TUI) that must not touch the engine.

Plain frozen data, no tensors: a snapshot can cross threads and be kept as long as needed.
Names follow vLLM's metrics where one exists (num_requests_running, kv_cache_usage_perc, ...).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tinyllm.request import Sampling


class RequestState(StrEnum):
    """Where a request is (a StrEnum: equal to, and written as, its value)."""

    QUEUED = "queued"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    ABORTED = "aborted"
    FAILED = "failed"


class Lifecycle(StrEnum):
    """What happened to a request (a LifecycleEvent's kind)."""

    QUEUED = "queued"
    ADMITTED = "admitted"
    PREFILL = "prefill"
    FIRST_TOKEN = "first_token"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    ABORTED = "aborted"
    FAILED = "failed"
    WAITING = "waiting"


REQUEST_STATES = tuple(RequestState)
LIFECYCLE_KINDS = tuple(Lifecycle)
ENDED_STATES = frozenset({RequestState.FINISHED, RequestState.ABORTED, RequestState.FAILED})  # how a request ends
# The reason of a sample's "queued" and "admitted" events when it forks off another's prompt (n > 1):
# FORK_OF + the parent's id. Viewers read forks from it (event log, timeline).
FORK_OF = "fork of #"
# Why a request computes nothing in a step: the scheduler's reason (RequestView.wait), one of these.
WAIT_REASONS = {
    "queue": "behind earlier requests in the policy's order",
    "slots": "max running sequences reached: no free slot",
    "pool": "KV pool full: not enough free blocks",
    "budget": "the step's token budget is used up",
    "preempted": "preempted (out of blocks, or for a higher-priority request)",
}


@dataclass(frozen=True)
class LifecycleEvent:
    """One change in a request's life, as the engine saw it happen (not rebuilt by diffing
    snapshots, which misses a request preempted and re-admitted within one step). Viewers
    derive their event log and slot flags from these."""

    kind: str  # one of LIFECYCLE_KINDS
    rid: int
    step: int  # the engine step it happened in (0: before the first step)
    time_s: float  # engine clock
    slot: int | None = None  # admitted: the slot taken; preempted/finished/aborted/failed: the slot freed
    tokens: int = 0  # queued/admitted: context tokens; prefill: the chunk's length;
    # preempted: tokens to recompute; finished/aborted: tokens generated
    reason: str = ""  # finished: "eos" / "stop" / "length"; preempted/failed: why;
    # waiting: "code: detail" (WAIT_REASONS), "" = computing again;
    # prefill: "start..end of context" (chunked prefill only)
    cached: int = 0  # admitted: context tokens served by the prefix cache

    def prefill_span(self) -> tuple[int, int, int]:
        """A prefill event's (start, end, context length), from its "start..end of N" reason."""
        span, _, total = self.reason.partition(" of ")
        start, _, end = span.partition("..")
        return int(start), int(end), int(total)


@dataclass(frozen=True, kw_only=True)
class SlotView:
    slot: int
    rid: int | None  # the request holding the slot, None when free
    context_len: int  # tokens stored for it (prompt + generated so far)
    capacity: int  # max tokens the slot can hold (max_len)
    blocks: tuple[int, ...] = ()  # paged: the slot's block table, in order
    just_admitted: bool = False  # admitted by the latest step
    prefill_left: int = 0  # chunked prefill: context tokens still to compute (0 = decoding)

    @property
    def free(self) -> bool:
        return self.rid is None


@dataclass(frozen=True, kw_only=True)
class RequestView:
    rid: int
    state: str  # one of REQUEST_STATES
    slot: int | None
    prompt: tuple[int, ...]
    tokens: tuple[int, ...]  # generated so far (EOS included if produced)
    max_new_tokens: int
    sampling: Sampling
    eos_id: int | None
    arrival_s: float  # engine clock
    first_token_s: float | None
    finish_s: float | None  # finished or aborted
    preemptions: int
    error: str | None = None  # failed: why the engine gave up on this request
    cached_tokens: int = 0  # prompt tokens served by the prefix cache at its first admission, as
    # OpenAI usage's cached_tokens (a recompute's hit: its "admitted" event)
    priority: int = 0  # the request's priority (the "priority" policy: lower first)
    tenant: str = ""  # the request's tenant (the "fair" policy)
    wait: str = ""  # why it computed nothing in the latest step (WAIT_REASONS code; "" = it ran)
    wait_detail: str = ""  # the scheduler's words, e.g. "KV pool full: needs 3 blocks, 1 free"
    admitted_s: float | None = None  # engine clock: its first admission (queue time ends here;
    # None while queued, and in recordings made before this field)
    spec_drafted: int = 0  # speculation: draft tokens verified for it
    spec_kept: int = 0  # of those, kept
    last_draft_step: int = -1  # the step of its latest draft, its tokens and how many were kept
    last_draft: int = 0
    last_kept: int = 0
    spec_drafts: int = 0  # speculation: drafts verified for it (its mean accepted length: 1 + kept / drafts)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def latency_s(self) -> float | None:
        return None if self.finish_s is None or self.state != "finished" else self.finish_s - self.arrival_s

    def tokens_per_s(self, now_s: float) -> float | None:
        """Decode rate after the first token."""
        if self.first_token_s is None or len(self.tokens) < 2:
            return None
        end = self.finish_s if self.finish_s is not None else now_s
        return (len(self.tokens) - 1) / max(1e-9, end - self.first_token_s)


@dataclass(frozen=True, kw_only=True)
class KVView:
    kind: str  # "slots" | "paged"
    reserved_tokens: int  # capacity held by the cache
    allocated_tokens: int  # claimed by requests (whole slots, or blocks)
    used_tokens: int  # real context tokens stored
    bytes_per_token: int
    block_size: int | None = None
    n_blocks: int | None = None
    free_blocks: int | None = None
    block_owner: tuple[int | None, ...] = ()  # paged: per block, a rid that holds it
    block_refs: tuple[int, ...] = ()  # paged: per block, how many requests hold it (shared > 1)
    block_cached: tuple[bool, ...] = ()  # paged: per block, holds a cached prefix (revivable when free)
    cached_free_blocks: int = 0  # free blocks that still hold a cached prefix
    dtype: str = ""  # the K/V element type ("float32", "bfloat16"; "": not known)

    def mib(self, tokens: int) -> float:
        return tokens * self.bytes_per_token / 2**20

    @classmethod
    def empty(cls, kind: str, reserved_tokens: int = 0, bytes_per_token: int = 0, **blocks) -> KVView:
        """A cache with nothing in it yet (``blocks``: a paged one's block_size, n_blocks, ...)."""
        return cls(
            kind=kind,
            reserved_tokens=reserved_tokens,
            allocated_tokens=0,
            used_tokens=0,
            bytes_per_token=bytes_per_token,
            **blocks,
        )


@dataclass(frozen=True)
class Counters:
    steps: int = 0  # step() calls
    decode_steps: int = 0
    prefills: int = 0  # padded prefill batches run
    prefill_tokens: int = 0  # real context tokens prefilled (recompute included)
    preemptions: int = 0  # num_preemptions_total
    peak_active: int = 0
    useful_tokens: int = 0  # tokens of finished requests
    generated_tokens: int = 0  # every token produced, any request
    finished: int = 0
    aborted: int = 0
    failed: int = 0  # requests the engine could not run (see RequestView.error)
    prefix_queries: int = 0  # context tokens looked up in the prefix cache (vLLM: prefix_cache_queries)
    prefix_hits: int = 0  # of those, tokens served from cached blocks (vLLM: prefix_cache_hits)
    computed_rows: int = 0
    useful_rows: int = 0
    spec_draft_tokens: int = 0  # speculation (engine/speculate.py): draft tokens verified
    spec_accepted_tokens: int = 0  # of those, accepted
    spec_accepted_per_pos: tuple[int, ...] = ()  # accepted tokens by draft position
    spec_drafts: int = 0  # drafts verified


@dataclass(frozen=True, kw_only=True)
class EngineSnapshot:
    time_s: float
    n_slots: int
    max_len: int
    slots: tuple[SlotView, ...]
    requests: tuple[RequestView, ...]  # every request the engine has seen, by id
    queue: tuple[int, ...]  # waiting, next first
    kv: KVView
    counters: Counters
    max_batched_tokens: int | None = None  # the token-budget scheduler's budget; None: the seed's scheduler
    policy: str = "fcfs"  # the scheduling policy (engine/policy.py)
    batch: tuple[tuple[int, int], ...] = ()  # the latest step's batch: (rid, tokens computed), batch order
    speculative: int = 0  # speculation: tokens drafted per step (0: off)
    speculative_off: bool = False  # the latest step drafted nothing: its batch was too large
    speculative_error: str = ""  # the latest proposal that failed (a draft model's pass): no drafts that step
    speculative_method: str = "ngram"  # who drafts: "ngram" (prompt lookup) or "draft_model" (engine/speculate.py)

    @classmethod
    def empty(cls, kv: KVView, n_slots: int = 0, max_len: int = 0, **settings) -> EngineSnapshot:
        """An engine with nothing in it yet: every slot free, no request (a loading screen's, a
        recording's start). ``settings``: max_batched_tokens, policy."""
        return cls(
            time_s=0.0,
            n_slots=n_slots,
            max_len=max_len,
            slots=tuple(SlotView(slot=s, rid=None, context_len=0, capacity=max_len) for s in range(n_slots)),
            requests=(),
            queue=(),
            kv=kv,
            counters=Counters(),
            **settings,
        )

    @property
    def num_requests_running(self) -> int:
        return sum(not s.free for s in self.slots)

    @property
    def num_requests_waiting(self) -> int:
        return len(self.queue)

    @property
    def busy(self) -> bool:
        """A request runs or waits: the engine has work in hand (else it is idle, generating nothing)."""
        return bool(self.num_requests_running or self.num_requests_waiting)

    @property
    def kv_cache_usage_perc(self) -> float:
        """Fraction of the cache claimed by requests (vLLM's meaning), 0..1."""
        return self.kv.allocated_tokens / max(1, self.kv.reserved_tokens)

    def wait_counts(self) -> dict[str, int]:
        """Requests waiting (queued, or running but idle this step) per WAIT_REASONS code."""
        out: dict[str, int] = {}
        for v in self.requests:
            if v.wait and v.state in ("queued", "preempted", "running"):
                out[v.wait] = out.get(v.wait, 0) + 1
        return out

    def request(self, rid: int) -> RequestView | None:
        i = bisect_left(self.requests, rid, key=lambda r: r.rid)  # sorted by id
        return self.requests[i] if i < len(self.requests) and self.requests[i].rid == rid else None
