"""What a viewer sees of a race lane: plain frozen data, no torch (the app draws these, and the
race's engine process sends them over a pipe)."""

from __future__ import annotations

from dataclasses import dataclass

from tinyllm.request import kv_dtype_tag

LANES = ("static", "continuous", "chunked")  # every lane, in the order they are shown
LANE_TITLES = {
    "static": "static batching",
    "continuous": "continuous batching",
    "chunked": "token budget + prefix cache",
}
ROW_STATES = ("free", "prefill", "running", "wasted", "done")


def lane_detail(key: str, slots: int, batch_timeout_s: float, budget: int, arrivals: bool) -> str:
    """One line saying how the lane schedules (shown under its title)."""
    if key == "static":
        wait = f"; starts a batch when {slots} wait or the oldest has waited {batch_timeout_s:g} s" if arrivals else ""
        return f"batches of {slots}, each until its longest row is done{wait}"
    if key == "continuous":
        return f"{slots} slots, refilled every step (prefill, then decode)"
    return f"{slots} slots, paged KV, ≤{budget} tok/step, chunked prefill, prefix cache"


def mib(x: float) -> str:
    """A KV size: ``32 MiB``, ``1.5 MiB``, ``0.25 MiB``."""
    return f"{x:.0f} MiB" if x >= 10 else f"{x:.3g} MiB"


def capacity(seqs: int, kv_mib: float | None, kv_dtype: str = "") -> str:
    """How many sequences the lane can run at once and the KV memory it holds: ``64 seqs · 32
    MiB``, ``· 32 MiB bf16`` where its K/V is not float32 (the same MiB then holds twice the
    tokens). Unknown (0 / None, while loading): ``?``."""
    n = f"{seqs} seq{'s' if seqs != 1 else ''}" if seqs else "? seqs"
    tag = kv_dtype_tag(kv_dtype)
    return f"{n} · {'? MiB' if kv_mib is None else mib(kv_mib)}{' ' + tag if tag else ''}"


@dataclass(frozen=True)
class RowView:
    """One batch row / slot of a lane."""

    rid: int | None  # the request in it, None when free
    state: str  # one of ROW_STATES: wasted = finished, still computed (static)
    progress: int = 0  # tokens generated (prefill: prompt tokens computed so far)
    goal: int = 0  # max_new_tokens (prefill: the prompt's length)


@dataclass(frozen=True)
class LaneResult:
    """The finish line's figures for a lane: ``Stats.summary`` on the lane's own clock, as
    ``tinyllm bench`` prints them."""

    wall_s: float
    useful_tokens: int
    tok_s: float
    ttft_p50_s: float
    ttft_p95_s: float
    latency_p95_s: float
    row_util: float
    kv_used_mean: float
    decode_steps: int
    computed_rows: int
    useful_rows: int
    prefill_tokens: int
    preemptions: int = 0  # requests sent back to the queue to free KV (paged lanes only)
    busy_s: float = 0.0  # of wall_s, the lane's compute: without its idle waits for arrivals


@dataclass(frozen=True)
class LaneView:
    key: str  # one of LANES
    title: str
    detail: str
    rows: tuple[RowView, ...]
    queued: int  # arrived, waiting for a batch / slot
    arriving: int  # not arrived yet (on this lane's clock)
    done: int  # requests finished
    total: int
    tokens: int  # tokens generated so far
    total_tokens: int  # tokens the workload asks for (no early stop: known up front)
    clock_s: float  # this lane's clock: its own compute time (+ idle gaps before arrivals)
    ttft_p50_s: float | None  # over the requests that have a first token
    decode_steps: int
    computed_rows: int
    useful_rows: int
    kv_used: int  # real context tokens in the KV cache
    kv_reserved: int  # KV memory the lane holds, in tokens
    note: str = ""  # what it is waiting for, when it waits
    result: LaneResult | None = None  # set once every request is done
    trace: tuple[tuple[float, int], ...] = ((0.0, 0),)  # (clock_s, tokens) over the race, thinned
    kind: str = ""  # one of race.spec.KINDS ("" = key, the default lanes)
    outcomes: tuple[RequestOutcome, ...] = ()  # per request, set once the lane is done (what-if)
    seqs: int = 0  # sequences it can run at once: batch size, slots, max_num_seqs (0: not known yet)
    kv_mib: float | None = None  # the KV memory it holds (static: rows of max_len), None: not known yet
    kv_blocks: int | None = None  # paged lanes: the pool's blocks
    kv_dtype: str = ""  # its K/V element type ("float32", "bfloat16"; "": not known yet)
    kernels: str = ""  # what runs its passes (engine.forward.kernels_of): the same for every lane

    @property
    def capacity(self) -> str:
        """``64 seqs · 32 MiB``: why a lane at the same memory runs more (or fewer) requests."""
        return capacity(self.seqs, self.kv_mib, self.kv_dtype)

    @property
    def finished(self) -> bool:
        return self.result is not None

    @property
    def row_util(self) -> float:
        return self.useful_rows / self.computed_rows if self.computed_rows else 0.0


@dataclass(frozen=True)
class RequestOutcome:
    """One request's life in one lane, for the what-if comparison (times on the lane's clock)."""

    rid: int
    ttft_s: float
    itl_p99_s: float | None  # inter-token latency p99 (None: fewer than 2 tokens)
    e2e_s: float  # arrival -> last token
    preemptions: int
    waited: tuple[tuple[str, int], ...] = ()  # (WAIT_REASONS code, steps), most first
    spans: tuple[tuple[str, float, float], ...] = ()  # (phase, start_s, end_s): queued/prefill/decode/preempted
    arrival_s: float = 0.0
    prompt_tokens: int = 0
    new_tokens: int = 0
    priority: int = 0
    tenant: str = ""


# What a finish table says where the lanes kept up with arrivals (idled): why tok/s ties, what to read.
ARRIVALS_NOTE = (
    "requests arrived over time, so every lane's tok/s is about the rate they came at: compare latency; busy = compute"
)


def idled(lanes) -> bool:
    """Whether the finished lanes kept up with requests arriving over time: each waited for
    arrivals and their clocks ended within 10% of each other (about the last arrival), so every
    lane's tok/s is about the offered load, and latency tells them apart. (Lanes that fell behind
    end far apart: their tok/s differ, and say so.)"""
    done = [v.result for v in lanes if v.result is not None]
    return (
        len(done) == len(lanes) > 0
        and all(r.wall_s - r.busy_s > 1e-6 for r in done)
        and max(r.wall_s for r in done) <= 1.1 * min(r.wall_s for r in done)
    )


def lane_title(label: str, kind: str) -> str:
    """A lane's title: the kind's own name for a lane that says only its kind, else its label."""
    return LANE_TITLES[kind] if label == kind else label


def waiting_lane(
    key: str, detail: str, rows: int, total: int, total_tokens: int, title: str | None = None, kind: str = ""
) -> LaneView:
    """A lane before its first step (free rows, nothing done): what the app shows while loading.
    ``rows`` 0: not known until the model is loaded (a KV memory budget sizes the lane)."""
    return LaneView(
        key,
        title or LANE_TITLES[key],
        detail,
        tuple(RowView(None, "free") for _ in range(rows)),
        0,
        total,
        0,
        total,
        0,
        total_tokens,
        0.0,
        None,
        0,
        0,
        0,
        0,
        0,
        kind=kind or key,
        seqs=rows,
    )
