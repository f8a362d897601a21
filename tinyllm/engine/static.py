"""Static batching, the seed's baseline: B requests at a time, decoded until the batch's
*longest* request is done. Rows that finish early keep computing (wasted work), and the next batch
waits for the slowest row.

``StaticBatcher`` is that loop one step at a time, as an object: the race (``tinyllm.race``)
interleaves static batching with the continuous schedulers step by step and shows every step, so
the baseline must stop after each forward pass; ``run_static`` runs the same object to the end,
so there is one static batching, not two.

Static batching is a schedule, not a kernel: its passes run on the same forward as every other
scheduler (``forward.ragged_forward``, over a block pool). Its rule: a batch reserves, for each
row, the batch's longest prompt plus its largest ``max_new_tokens`` (the padded row the seed's
dense batch held), all up front; the prefill computes every row's prompt; each decode computes
every row of the batch -- finished rows included: they are computed and thrown away until the
batch's longest row is done (the waste static batching is known for, counted in rows, not time).
Each step then samples the next token of every row still generating.

Requests may arrive while a batch runs (the race replays a workload's ``arrival_s``): they wait for
the next batch. A batch starts when ``batch_size`` requests wait, when no more are coming
(``more_coming`` False: always so in run_static), or when the oldest has waited ``batch_timeout_s``
seconds of this engine's clock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tinyllm.config import DEFAULT_BLOCK_SIZE
from tinyllm.engine.forward import Row, kernels_for, kv_bytes_per_token, prefill_contexts, ragged_forward
from tinyllm.engine.forward import kv_cache_dtype as kv_cache_dtype_of
from tinyllm.engine.heap import freeze_startup_heap
from tinyllm.engine.sampler import sample_next
from tinyllm.engine.sequence import Event, is_done
from tinyllm.kv.paged import PagedKVCache
from tinyllm.model.transformer import Transformer
from tinyllm.observe.stats import Stats
from tinyllm.request import ContextTooLong, Request, Result, Sampling, check_fits, is_int


@torch.no_grad()
def run_static(
    model: Transformer,
    requests: list[Request],
    batch_size: int,
    temperature: float = 0.0,
    top_k=None,
    top_p=None,
    generator=None,
    kv_cache_dtype: str = "auto",
) -> tuple[list[Result], dict]:
    """Static batching: B requests at a time, each batch decoded until its longest row is done.
    Runs ``StaticBatcher`` to the end: every request arrives at t=0."""
    if any(r.sampling is not None for r in requests):
        raise ValueError("run_static uses one sampling setting; per-request sampling needs ContinuousEngine")
    eng = StaticBatcher(model, batch_size, temperature, top_k, top_p, generator, kv_cache_dtype=kv_cache_dtype)
    t0 = time.perf_counter()
    rids = [eng.add_request(r, arrival=0.0) for r in requests]
    while eng.has_work():
        eng.step()
    eng.stats.wall_s = time.perf_counter() - t0
    results = [eng.results[r] for r in rids]
    return results, eng.stats.summary(results)


@dataclass(frozen=True)
class BatchRow:
    """One row of the running batch, for viewers."""

    rid: int
    context_len: int  # prompt + tokens generated (frozen once the row is done)
    capacity: int  # tokens per row: the batch's padded prompt length + its largest max_new_tokens
    done: bool  # finished, yet still computed each step until the batch ends
    generated: int  # tokens generated
    max_new_tokens: int


@dataclass(eq=False)
class _Pending:
    rid: int
    req: Request
    arrival: float
    out: list[int] = field(default_factory=list)
    slot: int = -1  # its row in the pool while its batch runs


class StaticBatcher:
    """Static batching, stepwise (see the module docstring). Not thread-safe."""

    def __init__(
        self,
        model: Transformer,
        batch_size: int,
        temperature: float = 0.0,
        top_k=None,
        top_p=None,
        generator=None,
        clock: Callable[[], float] | None = None,
        batch_timeout_s: float = 0.0,
        kv_cache_dtype: str = "auto",
        max_len: int | None = None,
    ):
        freeze_startup_heap()  # no full-GC pauses mid-run (heap.py)
        if not is_int(batch_size) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        Sampling(temperature, top_k, top_p)  # validate once, with the usual messages
        model.eval()
        self.model = model
        self.device = next(model.parameters()).device
        self.batch_size = batch_size
        self.batch_timeout_s = batch_timeout_s
        self.more_coming = False  # a caller replaying arrivals sets this
        self._pick = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
        self.kv_dtype = kv_cache_dtype_of(self.device, kv_cache_dtype)  # the pool's K/V (ContinuousEngine's)
        self.max_len = model.cfg.max_seq_len if max_len is None else max_len  # the longest row a batch may reserve
        self.pool: PagedKVCache | None = None  # sized for the largest batch so far (_pool_for)
        self.kernels = kernels_for(self.device, self.kv_dtype)
        self.on_pass: Callable[[list[Row]], None] | None = None  # told each pass's rows before it runs
        # (a race lane prices them on its cost clock)
        self.stats = Stats(kv_bytes_per_token=kv_bytes_per_token(model, self.device, kv_cache_dtype))
        self.results: dict[int, Result] = {}
        self.first_s: dict[int, float] = {}  # rid -> when its first token came (this clock)
        self.steps = 0  # forward passes: prefills + decode steps
        self.generated = 0  # tokens sampled, every request
        self.queue: deque[_Pending] = deque()
        self.batch: list[_Pending] = []
        self.capacity = 0  # KV tokens the running batch holds (all rows)
        self._row_cap = 0
        self._n = 0
        self._logits = self._nxt = None
        t0 = time.perf_counter()
        self.now = clock or (lambda: time.perf_counter() - t0)
        self._limit = "the model's max_seq_len" if max_len is None else "max_len (the row a batch may reserve)"

    def add_request(self, req: Request, arrival: float | None = None) -> int:
        """Queue a request; returns its id. ``arrival`` (this clock) defaults to now."""
        if req.sampling is not None:
            raise ValueError("run_static uses one sampling setting; per-request sampling needs ContinuousEngine")
        check_fits(len(req.prompt), req.max_new_tokens, self.max_len, self._limit)
        rid, self._n = self._n, self._n + 1
        self.queue.append(_Pending(rid, req.frozen(), self.now() if arrival is None else arrival))
        return rid

    def ready(self) -> bool:
        """Whether step() would compute something now."""
        if self.batch:
            return True
        q = self.queue
        return bool(q) and (len(q) >= self.batch_size or not self.more_coming or self.deadline() <= self.now())

    def deadline(self) -> float:
        """When the waiting requests start as a partial batch (oldest arrival + the timeout)."""
        return self.queue[0].arrival + self.batch_timeout_s if self.queue else float("inf")

    def has_work(self) -> bool:
        return bool(self.batch) or bool(self.queue)

    def rows(self) -> tuple[BatchRow, ...]:
        cap = self._row_cap
        return tuple(
            BatchRow(
                p.rid, len(p.req.prompt) + len(p.out), cap, p.rid in self.results, len(p.out), p.req.max_new_tokens
            )
            for p in self.batch
        )

    def used_tokens(self) -> int:
        """Real context tokens of the rows still generating (what the KV cache usefully holds)."""
        return sum(len(p.req.prompt) + len(p.out) for p in self.batch if p.rid not in self.results)

    @torch.no_grad()
    def step(self) -> list[Event]:
        """One forward pass (a prefill, or a decode of every row), then the next tokens."""
        if not self.batch:
            if not self.ready():
                return []
            self._start_batch()
        else:
            live = [p for p in self.batch if p.rid not in self.results]
            st = self.stats
            st.decode_steps += 1
            st.computed_rows += len(self.batch)
            st.useful_rows += len(live)
            st.kv_used_tokens.append(self.used_tokens())
            st.kv_used_frac.append(st.kv_used_tokens[-1] / self.capacity)
            rows = [(p.slot, self.pool.lens[p.slot], 1) for p in self.batch]  # finished rows too
            self._logits = self._forward(rows, [p.out[-1] for p in self.batch], list(range(len(rows))))
        self.steps += 1
        return self._sample()

    def _start_batch(self) -> None:
        batch = [self.queue.popleft() for _ in range(min(self.batch_size, len(self.queue)))]
        L = max(len(p.req.prompt) for p in batch)
        new_max = max(p.req.max_new_tokens for p in batch)
        try:
            check_fits(L, new_max, self.max_len, self._limit)
        except ContextTooLong as e:
            self.queue.extendleft(reversed(batch))
            raise ContextTooLong(f"batch at request {batch[0].rid} (prompts padded to {L}): {e}") from None
        pool = self._pool_for(len(batch) * -(-(L + new_max) // DEFAULT_BLOCK_SIZE))
        for slot, p in enumerate(batch):  # the reservation: every row the padded row, up front
            p.slot = slot
            pool.activate(slot)
            pool.try_grow(slot, L + new_max)
        prompts = [list(p.req.prompt) for p in batch]
        try:
            self._logits = self._prefill(prompts)
        except BaseException:
            self._release(batch)
            self.queue.extendleft(reversed(batch))
            raise
        self.batch = batch
        self._row_cap = L + new_max
        self.capacity = len(batch) * self._row_cap
        self.stats.prefill_tokens += sum(map(len, prompts))
        self.stats.kv_reserved_tokens = max(self.stats.kv_reserved_tokens, self.capacity)

    def _pool_for(self, n_blocks: int) -> PagedKVCache:
        """A pool of at least ``n_blocks`` blocks (this batch's reservation), grown only when a batch
        needs more: memory follows the batches run, not the model's whole context per row."""
        if self.pool is None or self.pool.n_blocks < n_blocks:
            cfg = self.model.cfg
            self.pool = None  # (the old pool freed before the new one is allocated)
            self.pool = PagedKVCache(
                cfg.n_layers,
                self.batch_size,
                cfg.n_kv_heads,
                cfg.head_dim,
                n_blocks,
                DEFAULT_BLOCK_SIZE,
                self.max_len,
                self.kv_dtype,
                self.device,
            )
        return self.pool

    def _prefill(self, prompts: list[list[int]]):
        """The batch's prompts, each in its row, on the forward every scheduler runs."""
        if self.on_pass is not None:
            self.on_pass([(slot, 0, len(p)) for slot, p in enumerate(prompts)])
        return prefill_contexts(self.model, self.pool, list(range(len(prompts))), prompts)

    def _forward(self, rows: list[Row], flat: list[int], sample_at: list[int]):
        """One pass on the forward every scheduler runs; logits at ``sample_at``."""
        if self.on_pass is not None:
            self.on_pass(rows)
        return ragged_forward(self.model, self.pool, rows, flat, sample_at)

    def _release(self, batch: list[_Pending]) -> None:
        for p in batch:
            if self.pool.active[p.slot]:
                self.pool.release(p.slot)

    def _sample(self) -> list[Event]:
        self._nxt = sample_next(self._logits, **self._pick)
        toks = self._nxt.squeeze(-1).tolist()  # GPU sync: tokens to the host
        now = self.now()
        events = []
        for p, t in zip(self.batch, toks):
            if p.rid in self.results:
                continue
            p.out.append(t)
            self.generated += 1
            if len(p.out) == 1:
                self.first_s[p.rid] = now
            done = is_done(p.req, p.out)
            if done:
                self.results[p.rid] = Result(p.out, self.first_s[p.rid] - p.arrival, now - p.arrival)
                self.stats.useful_tokens += len(p.out)
            events.append(Event(p.rid, t, done))
        if all(p.rid in self.results for p in self.batch):
            self._release(self.batch)
            self.batch, self._logits = [], None
        return events
