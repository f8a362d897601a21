"""Continuous batching: requests join and leave a running batch of S slots, step by step.

Every step has one shape, nano-vllm's and vLLM V1's: the scheduler plans a forward pass
(``plan()``), the model runs it (``forward.py``), and this engine commits the outcome: sampled
tokens, request states, lifecycle events, counters. Two schedulers implement the one ``plan()``:
the seed's (``admission.py``: a prefill of newcomers, then a decode of every running sequence;
either cache) and the token-budget scheduler (``scheduler.py``, ``chunked_prefill=True``: one
pass of decodes and prefill chunks; paged cache only). Every pass runs on the same forward
(``forward.py``: ragged over a block pool; the slot cache is a pool that reserves max_len per slot). Both admit from one waiting queue, whose
order is the scheduling policy (``policy.py``).

Correctness: under greedy decoding each request's tokens equal its solo ``generate()`` output.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from tinyllm import native
from tinyllm.config import EngineConfig
from tinyllm.engine import forward
from tinyllm.engine.build import (
    check_budget_covers,
    check_kv_fits,
    check_max_len,
    engine_config,
    make_cache,
    make_scheduler,
    resolve_concurrency,
)
from tinyllm.engine.commit import Commits
from tinyllm.engine.forks import ForkSamples
from tinyllm.engine.forward import ModelRunner, kv_bytes_per_token
from tinyllm.engine.heap import freeze_startup_heap
from tinyllm.engine.lifecycle import Lifecycle
from tinyllm.engine.policy import WaitingQueue, waiting_queue
from tinyllm.engine.scheduler import Scheduler, StepPlan
from tinyllm.engine.sequence import Event, Sequence
from tinyllm.engine.views import EngineViews
from tinyllm.model.transformer import Transformer
from tinyllm.observe.snapshot import ENDED_STATES, LifecycleEvent, RequestState
from tinyllm.observe.stats import Stats
from tinyllm.request import DEFAULT_MAX_BATCHED_TOKENS, Request, Result, Sampling, SamplingError, check_fits, is_int

__all__ = ["DEFAULT_MAX_BATCHED_TOKENS", "ContinuousEngine", "run_continuous"]


class ContinuousEngine(Commits, Lifecycle, ForkSamples, EngineViews):
    """run_continuous's loop as an object, so requests can arrive while others decode.
    add_request() queues a request at any time; each step() plans, runs and commits this step's
    forward passes and returns the new tokens as Events. A finished request's Result is in
    ``results`` (pop it). The parts: ``scheduler`` plans, ``waiting`` holds the queue in the
    policy's order, ``runner`` runs the model on the cache (``slots``).

    Times are seconds on the engine clock (since construction); TTFT and latency count from the
    request's arrival. Sampling: the engine's settings are the default; a request's
    ``sampling`` overrides them. The sampler takes all rows in one call, each with its own
    settings; unseeded rows share ``generator``, a seeded row draws from its own (seed, position)
    stream. ``finish(rid, keep)`` ends a request whose stop string a detokenizing caller found.
    Not thread-safe: call add_request / step / abort / finish from one thread.

    Settings: ``config`` (an EngineConfig: tinyllm/config.py says what each setting means), or
    the same settings as keywords (``kv="paged", chunked_prefill=True, ...``), or both (the
    keywords replace the config's). ``n_slots`` is the seed's name of ``max_num_seqs``;
    ``cuda_graph`` may be a SlotGraphDecoder, to reuse its cache and captured graphs. With a KV
    memory budget, kv="slots" gets the slots of max_len it buys (at most max_num_seqs) and
    kv="paged" the blocks it buys (build.py). Paged: when a step needs a block and none is free,
    the policy's victim (by default the newest running request) is preempted and later
    recomputed from prompt + generated tokens. Every request that computes nothing in a step
    carries the scheduler's reason in its view (``wait``); ``snapshot().batch`` is the step's batch.

    One bad request never stops the others: a request whose admission or sampling fails ends
    in state "failed" (its slot freed, the reason in its view and a "failed" lifecycle event);
    everything else keeps running. ``pop_lifecycle()`` hands over what happened to each request
    (LifecycleEvents: queued, admitted, prefill, first_token, preempted, finished, aborted, failed).
    """

    def __init__(
        self,
        model: Transformer,
        n_slots: int | None = None,
        max_len: int | None = None,
        temperature: float = 0.0,
        top_k=None,
        top_p=None,
        generator=None,
        *,
        config: EngineConfig | None = None,
        **settings,
    ):
        config, decoder = engine_config(config, n_slots, max_len, settings)
        freeze_startup_heap()  # no full-GC pauses mid-run (heap.py)
        model.eval()
        device = next(model.parameters()).device
        if device.type == "cpu":
            native.library()  # the C kernels built now (a first build takes seconds), not in a first TTFT
        kv_dtype = forward.kv_cache_dtype(device, config.kv_cache_dtype)
        bytes_per_token = kv_bytes_per_token(model, device, config.kv_cache_dtype)
        max_len = check_max_len(model.cfg, config.max_len)
        n_slots, kv_blocks = resolve_concurrency(config, max_len, bytes_per_token)
        if config.chunked_prefill:
            check_budget_covers(config.budget, n_slots)
        if config.kv_memory_mib is not None:
            check_kv_fits(config.kv_memory_mib, device)  # (what the budget asks for, before it is allocated)
        self.config = config  # as given; the resolved sizes are below
        self.model = model
        self.device = device
        self.kv_cache_dtype = config.kv_cache_dtype  # as asked ("auto" too); the caches' own: slots.k.dtype
        self._kv_dtype_name = forward.kv_cache_dtype_name(device, config.kv_cache_dtype)
        self.n_slots = n_slots  # the cap on running sequences (max_num_seqs)
        self.kv_memory_mib = config.kv_memory_mib  # the budget it came from, if one was set
        self.max_num_seqs = config.max_num_seqs  # the cap asked for (None: the default)
        self.max_len = max_len
        self.sampling = Sampling(temperature, top_k, top_p)  # the default for every request
        if generator is None and config.seed is not None:
            generator = torch.Generator(device=device).manual_seed(config.seed)
        self.generator = generator
        self.kv_kind = config.kv
        self.slots, self.decoder = make_cache(model, config, n_slots, max_len, kv_blocks, kv_dtype, decoder)
        self.runner = ModelRunner(model, self.slots, self.decoder)
        self.kernels = self.runner.kernels  # what runs its passes, in words (forward.kernels_of)
        self.chunked_prefill = config.chunked_prefill
        self.scheduler: Scheduler = make_scheduler(self.slots, config, model)
        self.waiting: WaitingQueue = waiting_queue(config.scheduling_policy)
        self.policy = config.scheduling_policy
        self.prefix_cache = config.prefix_caching
        self._prefix_queries = self._prefix_hits = 0
        self.max_batched_tokens = config.budget if config.chunked_prefill else None
        self._running: list[Sequence] = []  # holding a slot, in admission order (newest last)
        self.stats = Stats(kv_bytes_per_token=bytes_per_token, kv_reserved_tokens=self.slots.reserved_tokens())
        self.results: dict[int, Result] = {}  # every ended request, until the caller pops it
        self._seqs: dict[int, Sequence] = {}  # every request, kept for snapshots
        self._next_rid = 0  # (until forget_ended drops old ones)
        self._slot_seq: list[Sequence | None] = [None] * n_slots
        self._just_admitted: set[int] = set()
        self._forked: set[int] = set()  # rids forked off a parent in this step
        self._batch: tuple[tuple[int, int], ...] = ()  # the latest step's (rid, tokens)
        self._lifecycle: list[LifecycleEvent] = []  # since the last pop_lifecycle()
        self._steps = self._prefills = self._generated = 0
        self._first_arrival: float | None = None  # engine time of the first request (stats)
        self._finished = self._aborted = self._failed = 0
        self._t0 = time.perf_counter()
        self._held_at: float | None = None  # hold_clock: when the clock stopped
        self._held_s = 0.0  # time the clock stood still, in all

    # -- public API ------------------------------------------------------------
    def now(self) -> float:
        """Seconds since the engine was built, less the time its clock was held, to the
        microsecond (short in recordings)."""
        t = self._held_at if self._held_at is not None else time.perf_counter()
        return round(t - self._t0 - self._held_s, 6)

    def hold_clock(self, held: bool) -> None:
        """Stop (True) or restart (False) the engine clock. An app paused by its user holds it,
        so TTFT, latency and tokens/s count the engine's time, not the time the user looked."""
        if held and self._held_at is None:
            self._held_at = time.perf_counter()
        elif not held and self._held_at is not None:
            self._held_s += time.perf_counter() - self._held_at
            self._held_at = None

    @property
    def steps(self) -> int:
        """step() calls so far (the step number lifecycle events carry)."""
        return self._steps

    def add_request(self, req: Request) -> int:
        """Queue a request; returns its id. Raises ValueError at once if it can never run.
        The engine keeps its own immutable copy: later changes to ``req`` change nothing."""
        seq = self._new_seq(req)
        self.waiting.add(seq)
        self._note("queued", seq, tokens=len(seq.req.prompt))
        return seq.rid

    def check_request(self, req: Request) -> Request:
        """``req`` as the engine would take it (a frozen, re-validated copy), or the error
        add_request would raise: out of the vocabulary, too long for a slot or the pool. Changes
        nothing, so a caller can check every prompt of a batch before queueing any."""
        if not isinstance(req, Request):
            raise ValueError(f"add_request needs a Request, got {type(req).__name__}")
        req = req.frozen()  # re-validated, prompt as a tuple
        vocab = self.model.cfg.vocab_size
        bad = next((t for t in req.prompt if t >= vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the model's vocabulary [0, {vocab})")
        bad = next((t for t in req.stop_token_ids if t >= vocab), None)
        if bad is not None:
            raise SamplingError("stop_token_ids", f"stop token id {bad} is outside the model's vocabulary [0, {vocab})")
        check_fits(len(req.prompt), req.max_new_tokens, self.max_len, "the slot's max_len")
        self.slots.check_fits(len(req.prompt) + req.max_new_tokens)  # paged: the whole pool, alone
        return req

    def _new_seq(self, req: Request) -> Sequence:
        """The engine's record of a new request (checked, given an id), not yet queued."""
        req = self.check_request(req)
        rid = self._next_rid
        self._next_rid += 1
        seq = Sequence(rid, req, req.sampling or self.sampling, self.now())
        if self._first_arrival is None:
            self._first_arrival = seq.arrival
        self._seqs[rid] = seq
        return seq

    def has_work(self) -> bool:
        return bool(self.waiting) or any(self.slots.active)

    def load(self) -> tuple[int, int]:
        """(requests waiting for a slot, forks waiting for their parent's prompt included;
        slots decoding a request)."""
        return len(self.waiting) + len(self._pending_forks()), sum(self.slots.active)

    def kv_used_frac(self) -> float:
        return self.slots.used_tokens() / max(1, self.slots.reserved_tokens())

    def abort(self, rid: int) -> bool:
        """Drop an unfinished request (e.g. its client went away), freeing its slot.
        Returns False if it is unknown (any non-id included) or already ended. No Result is kept."""
        seq = self._take_unfinished(rid)
        if seq is None:
            return False
        slot = seq.slot
        if slot is not None:
            self._free_slot(seq)
        seq.end(RequestState.ABORTED, self.now())
        self._ended_result(seq, "abort")
        self._aborted += 1
        self._note("aborted", seq, slot, len(seq.out))
        self._update_stats()
        return True

    def _take_unfinished(self, rid: int) -> Sequence | None:
        """The request ``rid`` if it has not ended (else None), out of the waiting queue and its
        fork group: about to end by the caller's hand (abort, finish)."""
        seq = self._seqs.get(rid) if is_int(rid) else None
        if seq is None or seq.state in ENDED_STATES:
            return None
        if seq in self.waiting:
            self.waiting.remove(seq)
        self._unfork(seq)
        return seq

    def finish(self, rid: int, keep: int | None = None) -> bool:
        """End an unfinished request now as finished with reason "stop": a stop string matched in
        its text, which only a caller that detokenizes can see (tinyllm.stops). Its first
        ``keep`` tokens stay (None: all); its slot and blocks are freed at once. Returns False
        if it is unknown or already ended."""
        seq = self._take_unfinished(rid)
        if seq is None:
            return False
        if keep is not None:
            del seq.out[max(0, keep) :], seq.logprobs[max(0, keep) :]
        self._finished_now(seq, self.now(), "stop")
        self._update_stats()
        return True

    def waited(self, rid: int) -> dict[str, int]:
        """Steps request ``rid`` spent waiting so far, per WAIT_REASONS code (empty if unknown)."""
        seq = self._seqs.get(rid)
        return dict(seq.waited) if seq is not None else {}

    def clear_prefix_cache(self) -> int:
        """Forget every cached prefix (blocks in use keep their K/V, but no new request will
        match them). Returns how many free cached blocks became plain free blocks."""
        return self.slots.clear_prefix_cache() if self.prefix_cache else 0

    def forget_ended(self, keep: int) -> int:
        """Drop all but the newest ``keep`` ended (finished, aborted, failed) requests, and their
        unclaimed results: a long-running server would otherwise keep every request it ever
        served, and each snapshot would list them all. Returns how many were dropped."""
        ended = [rid for rid, q in self._seqs.items() if q.state in ENDED_STATES]
        drop = ended[: max(0, len(ended) - keep)]
        for rid in drop:
            del self._seqs[rid]
            self.results.pop(rid, None)
        return len(drop)

    def pop_lifecycle(self) -> list[LifecycleEvent]:
        """The lifecycle events recorded since the last call, oldest first."""
        out, self._lifecycle = self._lifecycle, []
        return out

    @torch.no_grad()
    def step(self) -> list[Event]:
        """One step: each forward pass the scheduler plans is run on the model and committed
        before the next is planned. Returns the new tokens."""
        self._steps += 1
        self._just_admitted = set()
        self._forked = set()
        events: list[Event] = []
        ran: dict[int, int] = {}
        waits: dict[int, tuple[str, str]] = {}
        for plan in self.scheduler.plan(self._running, self.waiting):
            for seq, _, n in plan.items:
                ran[seq.rid] = ran.get(seq.rid, 0) + n
            waits.update(plan.waits)
            events += self._run(plan)
        forks = self._pending_forks()
        for child in forks:
            waits[child.rid] = "queue", f"a fork of #{child.fork_of}: waits for its prompt to be computed"
        self._batch = tuple(ran.items())
        self._explain(ran, waits, forks)
        self._update_stats()
        return events

    def _update_stats(self) -> None:
        """``stats`` as of this step, however the engine is driven (a step loop, run_continuous,
        a server): engine time since the first request arrived, prefix-cache counters, and the
        KV allocated now (0 once every request has ended: the leak check)."""
        st = self.stats
        st.prefix_cache_queries, st.prefix_cache_hits = self._prefix_queries, self._prefix_hits
        st.kv_allocated_at_end = self.slots.allocated_tokens()
        if self._first_arrival is not None:
            st.wall_s = self.now() - self._first_arrival

    def _explain(self, ran: dict[int, int], waits: dict[int, tuple[str, str]], forks: list[Sequence]) -> None:
        """Each request in hand (``forks``: the samples waiting for their parent's prompt) that
        computed nothing this step keeps the scheduler's reason (``seq.wait``, counted in
        ``seq.waited``); a "waiting" lifecycle event marks each change of reason, so timelines,
        recordings and traces show why, step by step."""
        for seq in [*self._running, *self.waiting, *forks]:
            ran_now = seq.rid in ran or seq.rid in self._forked
            why = None if ran_now else waits.get(seq.rid, ("queue", "waiting for the scheduler"))
            if why is not None:
                seq.waited[why[0]] = seq.waited.get(why[0], 0) + 1
            if why != seq.wait:
                code, was = why[0] if why else "", seq.wait[0] if seq.wait else ""
                admitted = why is None and seq.slot in self._just_admitted  # "admitted" says it
                if code != was and code != "preempted" and not admitted:  # "preempted" says it
                    self._note("waiting", seq, seq.slot, 0, f"{code}: {why[1]}" if why else "")
                seq.wait, seq.view = why, None

    def _run(self, plan: StepPlan) -> list[Event]:
        """The plan's decisions take effect, its forward runs, its outcome is committed."""
        self._take_effect(plan)
        if not plan.items:
            return []
        self._on_pass(plan)
        if plan.kind == "prefill":
            return self._isolated(plan, "admission failed")
        st = self.stats
        st.decode_steps += 1
        st.peak_active = max(st.peak_active, len(self._running))
        if plan.kind == "mixed":
            events = self._isolated(plan, "step failed")
            self._note_kv_use()
            return events
        st.computed_rows += self.n_slots if self.runner.every_slot else len(plan.items)  # slots: idle ones too
        st.useful_rows += len(plan.items)
        self._note_kv_use()
        return self._commit_decode(plan, self.runner(plan))

    def _on_pass(self, plan: StepPlan) -> None:
        """A forward pass of ``plan`` is about to run (a race lane prices it on its cost clock)."""

    def _take_effect(self, plan: StepPlan) -> None:
        """Preempted sequences go back in line; admitted ones (slot set by the scheduler) run."""
        for seq in plan.preempted:
            self._preempted(seq, seq.slot, plan.waits.get(seq.rid, ("", "out of KV blocks"))[1])
        self._prefix_queries += plan.prefix_queries
        self._prefix_hits += plan.prefix_hits
        for seq in plan.admitted:
            self._seat(seq, seq.slot, seq.context_len())

    def _isolated(self, plan: StepPlan, failure: str) -> list[Event]:
        """Run and commit ``plan``. If its forward raises, each item is retried alone, so only the
        request that breaks it fails (``failure``: the reason's start); the others go on."""
        try:
            out = self.runner(plan)
        except Exception as e:  # noqa: BLE001 - isolate the culprit below
            if len(plan.items) == 1:
                self._fail(plan.items[0][0], f"{failure}: {type(e).__name__}: {e}")
                return []
            return self._one_by_one(plan, failure)
        return self._commit(plan, out)

    def _one_by_one(self, plan: StepPlan, failure: str) -> list[Event]:
        events, ran = [], []
        for part in plan.alone():
            try:
                out = self.runner(part)
            except Exception as e:  # noqa: BLE001 - this request alone fails
                self._fail(part.items[0][0], f"{failure}: {type(e).__name__}: {e}")
                continue
            if part.kind == "prefill":  # an admission commits at once; mixed
                events += self._commit(part, out)  # items commit after all ran (as always)
            else:
                ran.append((part, out))
        for part, out in ran:
            events += self._commit(part, out)
        return events

    def _note_kv_use(self) -> None:
        used = self.slots.used_tokens()
        self.stats.kv_used_tokens.append(used)
        self.stats.kv_used_frac.append(used / self.slots.reserved_tokens())
        self.stats.kv_alloc_frac.append(used / max(1, self.slots.allocated_tokens()))


@torch.no_grad()
def run_continuous(
    model: Transformer, requests: list[Request], *engine_args: Any, **engine_kwargs: Any
) -> tuple[list[Result], dict]:
    """Offline continuous batching: every request queued at t=0, run to completion.
    A thin wrapper over ContinuousEngine: the arguments after ``requests`` are its own (n_slots,
    max_len, temperature, top_k, top_p, generator, then ``config=`` or EngineConfig's keywords)."""
    eng = ContinuousEngine(model, *engine_args, **engine_kwargs)
    t0 = time.perf_counter()
    rids = [eng.add_request(r) for r in requests]
    while eng.has_work():
        eng.step()
    st = eng.stats
    st.wall_s = time.perf_counter() - t0  # (the whole call: adding the requests too)
    failed = [v for v in eng.snapshot().requests if v.state == "failed"]
    if failed:
        raise RuntimeError(f"request {failed[0].rid} failed: {failed[0].error}")
    results = [eng.results.pop(r) for r in rids]
    return results, st.summary(results)
