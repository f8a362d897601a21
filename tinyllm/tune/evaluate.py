"""One tuning point run: a what-if lane (race/race.py ``build_race``) on the cost clock, its
figures kept as a small ``Outcome``.

Every point gets the same KV memory (the run's budget, or the point's own ``kv_memory_mib``),
turned into its pool's blocks by the engine's arithmetic (``blocks_for_budget``) at the real
model's bytes per token and the point's KV dtype, so a smaller block or a bfloat16 cache buys
more blocks of the same memory, as it would on the server.

The stand-in model: the lanes decode greedily and ignore end-of-text (race.py), so every
request makes exactly its max_new_tokens whatever the weights say; the schedule (admissions,
chunks, preemptions, waits) and the cost clock's time (rows, tokens, K/V reads) follow from the
token counts, the prompts (prefix hits) and the pool, not the weights. The points therefore run
on a one-layer random model of the same vocabulary and context, several times faster than the
real one; ``--no-stand-in`` runs the real model, and the wall-clock check always does. A point
that speculates (``num_speculative_tokens``) runs on the real model: the drafts kept depend on
the text it writes; the cost clock prices its verify passes' extra tokens as any others.

Points can run in worker processes (``fork``: the model and the requests are inherited, not
copied by pickling); each point's result is the same wherever it runs (the cost clock).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tinyllm.config import EngineConfig
from tinyllm.race.spec import LaneSpec
from tinyllm.race.verdicts import Judging, latency_p95
from tinyllm.tune.space import Point

MIB = 2**20


@dataclass(frozen=True)
class Outcome:
    """A point's figures on the first ``requests`` requests (by arrival)."""

    point: Point
    requests: int
    error: str = ""  # the engine refused the point (its reason); no figures
    goodput: float = 0.0  # requests/s meeting the SLO over the lane's finishing time
    met: int = 0
    judged: int = 0
    missed_by_reason: tuple[tuple[str, int], ...] = ()
    tok_s: float = 0.0
    wall_s: float = 0.0
    busy_s: float = 0.0
    ttft_p95_s: float = 0.0
    latency_p95_s: float = 0.0
    queued_mean_s: float = 0.0  # per request: time in the waiting queue before its first step
    preemptions: int = 0
    computed_rows: int = 0
    wasted_rows: int = 0  # rows computed for nothing (static batching's finished rows, padding)
    prefix_hits: int = 0  # prompt tokens served from cached blocks
    prefill_tokens: int = 0  # context tokens computed (recomputes after preemption included)
    waits: tuple[tuple[str, int], ...] = field(default=())  # steps waited per reason, all requests
    peak_kv_mib: float = 0.0  # the most KV the point held at once
    kv_pool_mib: float = 0.0  # the pool it was given
    kv_blocks: int = 0
    steps: int = 0

    def as_dict(self) -> dict:
        out = {k: v for k, v in vars(self).items() if k != "point"}
        out["point"] = self.point.as_dict()
        out["missed_by_reason"] = dict(self.missed_by_reason)
        out["waits"] = dict(self.waits)
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in out.items()}


@dataclass
class Bench:
    """What every point runs on: the model (stand-in or real), the requests sorted by arrival,
    their judging, the clock, the pool's arithmetic."""

    model: object
    arrivals: list  # (arrival_s, Request), sorted by arrival
    judging: Judging
    clock: object  # a CostModel (None: the wall clock)
    max_len: int
    kv_mib: float  # the run's KV budget
    bytes_per_token: dict[str, int]  # KV dtype -> the real model's bytes per token
    real_model: object = None  # where ``model`` is the stand-in: the real one, for speculating points


def lane_spec(point: Point, bench: Bench, label: str = "point") -> LaneSpec:
    """The point as a what-if lane: a token-budget lane (chunked prefill) or a prefill-then-
    decode lane on the paged pool, with the blocks its KV memory buys. ValueError if that
    memory cannot hold one request of max_len."""
    from tinyllm.engine.build import blocks_for_budget

    mib = point.kv_memory_mib or bench.kv_mib
    blocks = blocks_for_budget(mib, bench.max_len, point.block_size, bench.bytes_per_token[point.kv_cache_dtype])
    common = dict(
        policy=point.scheduling_policy,
        slots=point.max_num_seqs,
        block_size=point.block_size,
        kv_blocks=blocks,
        kv_dtype=point.kv_cache_dtype,
    )
    if point.chunked_prefill:
        return LaneSpec(
            label,
            "chunked",
            budget=point.max_batched_tokens,
            prefix_cache=point.prefix_cache,
            kv="paged",
            spec=point.num_speculative_tokens or None,
            **common,
        )
    return LaneSpec(label, "continuous", kv="paged", **common)


def run_point(point: Point, bench: Bench, n: int) -> Outcome:
    """The point on the first ``n`` requests, on the bench's clock (one lane, one race)."""
    from tinyllm.race.race import build_race

    try:
        spec = lane_spec(point, bench)
        run = EngineConfig.best(max_num_seqs=point.max_num_seqs, max_len=bench.max_len, block_size=point.block_size)
        # a speculating point runs on the real model: how many drafts are kept follows its text
        model = bench.real_model if point.num_speculative_tokens and bench.real_model is not None else bench.model
        race = build_race(model, bench.arrivals[:n], run, lanes=(spec,), step_cost_s=bench.clock)
    except ValueError as e:
        return Outcome(point, n, error=" ".join(str(e).split()))
    while race.step() is not None:
        pass
    lane = race.lanes[0]
    view = race.views()[0]
    return outcome_of(point, n, lane, view, bench)


def outcome_of(point: Point, n: int, lane, view, bench: Bench) -> Outcome:
    """A finished lane's figures."""
    r = view.result
    judging = Judging(bench.judging.slo, bench.judging.own[:n], bench.judging.ended[:n])
    summary = judging.summary(view)
    waits: dict[str, int] = {}
    queued = 0.0
    for o in view.outcomes:
        for code, steps in o.waited:
            waits[code] = waits.get(code, 0) + steps
        queued += sum(end - start for phase, start, end in o.spans if phase == "queued")
    stats = lane.engine.stats
    bpt = bench.bytes_per_token[point.kv_cache_dtype]
    return Outcome(
        point,
        n,
        goodput=summary.goodput if summary else 0.0,
        met=summary.met if summary else 0,
        judged=summary.judged if summary else 0,
        missed_by_reason=summary.reasons if summary else (),
        tok_s=r.tok_s,
        wall_s=r.wall_s,
        busy_s=r.busy_s,
        ttft_p95_s=r.ttft_p95_s,
        latency_p95_s=latency_p95(view, judging),
        queued_mean_s=queued / max(1, len(view.outcomes)),
        preemptions=r.preemptions,
        computed_rows=r.computed_rows,
        wasted_rows=r.computed_rows - r.useful_rows,
        prefix_hits=stats.prefix_cache_hits,
        prefill_tokens=r.prefill_tokens,
        waits=tuple(sorted(waits.items(), key=lambda kv: (-kv[1], kv[0]))),
        peak_kv_mib=max(stats.kv_used_tokens, default=0) * bpt / MIB,
        kv_pool_mib=(view.kv_blocks or 0) * point.block_size * bpt / MIB,
        kv_blocks=view.kv_blocks or 0,
        steps=r.decode_steps,
    )


# -- many points: here, or in worker processes ----------------------------------------------------

_BENCH: Bench | None = None  # the workers' bench (inherited through fork)


def _run_in_worker(job: tuple[Point, int]) -> Outcome:
    import torch

    torch.set_num_threads(1)  # one core per worker
    assert _BENCH is not None
    return run_point(job[0], _BENCH, job[1])


class Evaluator:
    """Runs points (each once per prefix length: a cache), in ``jobs`` processes where > 1."""

    def __init__(self, bench: Bench, jobs: int = 1, on_done: Callable[[Outcome], None] | None = None):
        self.bench, self.jobs, self.on_done = bench, jobs, on_done
        self.cache: dict[tuple[Point, int], Outcome] = {}
        self._pool = None

    def __call__(self, points: Sequence[Point], n: int) -> list[Outcome]:
        todo = [p for p in dict.fromkeys(points) if (p, n) not in self.cache]
        if self.jobs > 1 and len(todo) > 1:
            for o in self._executor().map(_run_in_worker, [(p, n) for p in todo], chunksize=1):
                self._done(o)
        else:
            for p in todo:
                self._done(run_point(p, self.bench, n))
        return [self.cache[(p, n)] for p in points]

    def _done(self, o: Outcome) -> None:
        self.cache[(o.point, o.requests)] = o
        if self.on_done is not None:
            self.on_done(o)

    def _executor(self):
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            global _BENCH
            _BENCH = self.bench
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("fork"))
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def stand_in(model):
    """A one-layer random model with the real one's vocabulary and context (the module
    docstring says why the schedule is the same on it)."""
    import torch

    from tinyllm.model.config import ModelConfig
    from tinyllm.model.transformer import Transformer

    cfg = model.cfg
    torch.manual_seed(0)
    small = ModelConfig(
        vocab_size=cfg.vocab_size,
        d_model=16,
        n_layers=1,
        n_heads=1,
        n_kv_heads=1,
        d_ff=16,
        max_seq_len=cfg.max_seq_len,
        rope_theta=cfg.rope_theta,
        tie_embeddings=True,
    )
    return Transformer(small).to(next(model.parameters()).device).eval()


def kv_budget_mib(slots: int, max_len: int, bytes_per_token: int) -> float:
    """The memory of ``slots`` slots of max_len: the defaults' KV when no --kv-memory is given."""
    return math.ceil(slots * max_len * bytes_per_token / MIB * 1000) / 1000
