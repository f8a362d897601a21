"""One race lane: a scheduler, its own clock, and the workload's arrivals on that clock.

A lane steps one forward pass at a time (``step``) and says when on its own clock it can next
compute (``ready_at``), so the race can always step the lane that is furthest behind. Requests
arrive when the lane's clock reaches their ``arrival_s``; a lane with nothing to compute jumps its
clock to the next arrival. TTFT and latency count from that nominal arrival.
"""

from __future__ import annotations

from collections import deque

from tinyllm.engine import ContinuousEngine, Request, Result
from tinyllm.engine.static import StaticBatcher
from tinyllm.observe.stats import Stats, percentile
from tinyllm.observe.timeline import Timeline
from tinyllm.race.clock import LaneClock
from tinyllm.race.cost import PassWork
from tinyllm.race.views import LaneResult, LaneView, RequestOutcome, RowView

Workload = list[tuple[float, Request]]  # (arrival_s, request), sorted by arrival
TRACE_POINTS = 256  # a lane's (clock, tokens) trace is thinned to at most this
Timing = tuple[int, float, float]  # (rid, first token, finish) on the lane's clock


class Lane:
    """What every lane shares: arrivals, the clock, the figures. Subclasses wrap one engine."""

    engine: StaticBatcher | ContinuousEngine

    def __init__(self, key: str, title: str, kind: str, detail: str, clock: LaneClock, workload: Workload):
        self.key, self.title, self.kind, self.detail, self.clock = key, title, kind, detail, clock
        self._pending = deque(workload)
        self.arrival: dict[int, float] = {}  # rid -> nominal arrival (this clock)
        self.requests: dict[int, Request] = {}
        self.total = len(workload)
        self.total_tokens = sum(r.max_new_tokens for _, r in workload)
        self._result: LaneResult | None = None
        self.tokens = 0  # tokens generated so far (every request)
        self.trace: list[tuple[float, int]] = [(0.0, 0)]  # (clock, tokens) after each step, thinned
        self.token_times: dict[int, list[float]] = {}  # rid -> when each of its tokens came (this clock)
        self._outcomes: tuple[RequestOutcome, ...] = ()
        self.seqs, self.kv_mib, self.kv_blocks = 0, None, None  # what it can run, its KV memory (build_race)
        self.kv_dtype = ""  # its K/V element type (build_race)

    # -- what a subclass provides ---------------------------------------------------------------
    def _add(self, req: Request, arrival: float) -> int:
        raise NotImplementedError

    def _can_step(self) -> bool:
        """Something to compute right now."""
        raise NotImplementedError

    def _busy(self) -> bool:
        """Requests in hand (running or waiting in the engine)."""
        raise NotImplementedError

    def _engine_step(self) -> list:
        """One step of the engine; returns its token Events."""
        raise NotImplementedError

    def _outcome(self, rid: int, first: float, end: float, times: list[float]) -> RequestOutcome:
        raise NotImplementedError

    def _stats(self) -> Stats:
        return self.engine.stats

    def _finished(self) -> list[Timing]:
        raise NotImplementedError

    def _next_deadline(self) -> float:
        return float("inf")

    # -- the race's interface -------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self._pending) or self._busy()

    def ready_at(self) -> float:
        """When, on this lane's clock, it can next compute: now if it has work in hand, else at
        the next arrival (or, static batching, when a partial batch stops waiting)."""
        self._release()
        if self._can_step():
            return self.clock.now()
        nxt = self._pending[0][0] if self._pending else float("inf")
        return min(nxt, self._next_deadline())

    def step(self) -> bool:
        """Idle until ready_at(), then one forward pass on the clock. False if the lane only moved
        its clock (an arrival that still leaves a partial batch waiting)."""
        self.clock.skip_to(self.ready_at())
        self._release()
        if not self._can_step():
            return False
        events = self.clock.timed(self._engine_step)
        self.tokens += len(events)
        for ev in events:
            self.token_times.setdefault(ev.rid, []).append(self.clock.elapsed)
        self.trace.append((self.clock.elapsed, self.tokens))
        if len(self.trace) > TRACE_POINTS:  # every other point, the first and the newest kept
            self.trace = self.trace[:-1:2] + self.trace[-1:]
        return True

    def result(self) -> LaneResult | None:
        """The finish line's figures (``Stats.summary``, as tinyllm bench prints them) once every
        request is done; TTFT and latency from each nominal arrival, on this lane's clock."""
        if self._result is None and not self.has_work():
            stats = self._stats()
            stats.wall_s = self.clock.elapsed
            results = [
                Result([], first - self.arrival[rid], end - self.arrival[rid]) for rid, first, end in self._finished()
            ]
            s = stats.summary(results)
            self._result = LaneResult(
                s["wall_s"],
                s["useful_tokens"],
                s["tok_s"],
                s["ttft_p50_s"],
                s["ttft_p95_s"],
                s["latency_p95_s"],
                s["row_util"],
                s["kv_used_mean"],
                s["decode_steps"],
                stats.computed_rows,
                stats.useful_rows,
                s["prefill_tokens_computed"],
                stats.preemptions,
                self.clock.elapsed - self.clock.idle,
            )
            self._outcomes = tuple(
                self._outcome(rid, first, end, self.token_times.get(rid, []))
                for rid, first, end in sorted(self._finished())
            )
        return self._result

    def outcomes(self) -> tuple[RequestOutcome, ...]:
        """Per request, once the lane is done (the what-if comparison)."""
        self.result()
        return self._outcomes

    def _times(self, rid: int, first: float, end: float, times: list[float]) -> tuple[float, float | None, float]:
        """(TTFT, inter-token latency p99, end-to-end) from the nominal arrival."""
        gaps = sorted(b - a for a, b in zip(times, times[1:]))
        return first - self.arrival[rid], percentile(gaps, 0.99) if gaps else None, end - self.arrival[rid]

    def _who(self, rid: int) -> dict:
        """The request's own fields, for the outcome (the comparison groups by them)."""
        r = self.requests[rid]
        return dict(
            arrival_s=self.arrival[rid],
            prompt_tokens=len(r.prompt),
            new_tokens=r.max_new_tokens,
            priority=r.priority,
            tenant=r.tenant,
        )

    def _release(self) -> None:
        now = self.clock.now()
        while self._pending and self._pending[0][0] <= now:
            t, req = self._pending.popleft()
            rid = self._add(req, t)
            self.arrival[rid], self.requests[rid] = t, req

    def _note(self) -> str:
        if not self._busy() and self._pending:
            return f"idle: the next request arrives at {self._pending[0][0]:.2f} s"
        return ""

    def _view(
        self,
        rows: list[RowView],
        queued: int,
        done: int,
        tokens: int,
        firsts: list[tuple[int, float]],
        kv_used: int,
        kv_reserved: int,
        note: str,
    ) -> LaneView:
        ttft = sorted(t - self.arrival[rid] for rid, t in firsts)
        st = self._stats()
        return LaneView(
            self.key,
            self.title,
            self.detail,
            tuple(rows),
            queued,
            len(self._pending),
            done,
            self.total,
            tokens,
            self.total_tokens,
            self.clock.now(),
            percentile(ttft, 0.5) if ttft else None,
            st.decode_steps,
            st.computed_rows,
            st.useful_rows,
            kv_used,
            kv_reserved,
            note,
            self.result(),
            tuple(self.trace),
            self.kind,
            self._outcomes,
            self.seqs,
            self.kv_mib,
            self.kv_blocks,
            self.kv_dtype,
            self.engine.kernels,
        )


class StaticLane(Lane):
    """Static batching (StaticBatcher): rows that finished keep being computed, shown as wasted."""

    def __init__(self, key: str, title: str, detail: str, clock: LaneClock, workload: Workload, engine: StaticBatcher):
        super().__init__(key, title, "static", detail, clock, workload)
        self.engine = engine
        engine.on_pass = lambda rows: clock.charge(PassWork.of_rows(rows))
        self._ended: tuple[int, ...] = ()  # the batch that ended in the latest step
        self._started: dict[int, float] = {}  # rid -> when its batch started (this lane's clock)
        self._queued_steps: dict[int, int] = {}  # rid -> steps it sat in the queue behind a batch

    def _add(self, req, arrival):
        return self.engine.add_request(req, arrival)

    def _can_step(self):
        self.engine.more_coming = bool(self._pending)
        return self.engine.ready()

    def _busy(self):
        return self.engine.has_work()

    def _next_deadline(self):
        return self.engine.deadline()

    def _engine_step(self):
        before = tuple(r.rid for r in self.engine.rows())
        queued, start = [p.rid for p in self.engine.queue], self.clock.elapsed  # (the step's start)
        events = self.engine.step()
        still = {p.rid for p in self.engine.queue}
        for rid in queued:  # each waited this step for a batch, or its batch started with it
            if rid in still:
                self._queued_steps[rid] = self._queued_steps.get(rid, 0) + 1
            else:
                self._started[rid] = start
        self._ended = before if not self.engine.batch else ()
        return events

    def _outcome(self, rid, first, end, times):
        """Static batching's one reason to wait is its queue ("queue"): for a batch to fill, or for
        the batch ahead to end (the steps it waited, at least 1 where it waited only for time)."""
        ttft, itl, e2e = self._times(rid, first, end, times)
        arrival = self.arrival[rid]
        started = self._started.get(rid, arrival)
        waited = (("queue", max(1, self._queued_steps.get(rid, 0))),) if started > arrival else ()
        spans = (("queued", arrival, started),) * (started > arrival) + (
            ("prefill", started, first),
            ("decode", first, end),
        )
        return RequestOutcome(rid, ttft, itl, e2e, 0, waited, spans, **self._who(rid))

    def _finished(self):
        e = self.engine
        return [(rid, e.first_s[rid], self.arrival[rid] + r.latency_s) for rid, r in e.results.items()]

    def view(self) -> LaneView:
        self._release()  # what has arrived by now is waiting, not arriving
        e = self.engine
        rows = [RowView(r.rid, "wasted" if r.done else "running", r.generated, r.max_new_tokens) for r in e.rows()]
        rows = rows or [RowView(rid, "done") for rid in self._ended]
        rows += [RowView(None, "free")] * (e.batch_size - len(rows))
        note = self._note()
        if e.queue and not e.batch and e.more_coming:
            note = f"waits for a full batch: {len(e.queue)}/{e.batch_size}, or until {e.deadline():.2f} s"
        return self._view(
            rows, len(e.queue), len(e.results), e.generated, list(e.first_s.items()), e.used_tokens(), e.capacity, note
        )


class _ClockedEngine(ContinuousEngine):
    """ContinuousEngine on the lane's clock (every time stamp it makes goes through ``now``)."""

    def __init__(self, *args, lane_clock: LaneClock, **kw):
        self._lane_clock = lane_clock
        super().__init__(*args, **kw)

    def now(self) -> float:
        return self._lane_clock.now()

    def _on_pass(self, plan) -> None:
        """The pass's work, priced on the lane's clock: every lane runs the same forward, so the
        same rows cost the same in every lane (the CUDA-graph decode computes every slot)."""
        if plan.kind == "decode" and self.runner.every_slot:
            window = max(start for _, start, _ in plan.items) + 1
            self._lane_clock.charge(PassWork(self.n_slots, self.n_slots, self.n_slots * window))
        else:
            self._lane_clock.charge(PassWork.of_rows(plan.items))


class ContinuousLane(Lane):
    """ContinuousEngine: the seed's scheduler (slots) or the token-budget one (paged, chunked)."""

    def __init__(
        self,
        key: str,
        title: str,
        kind: str,
        detail: str,
        clock: LaneClock,
        workload: Workload,
        model,
        n_slots: int,
        **engine_kw,
    ):
        super().__init__(key, title, kind, detail, clock, workload)
        self.engine = _ClockedEngine(model, n_slots, lane_clock=clock, **engine_kw)
        self.timeline = Timeline()  # each request's spans (the what-if's rows)
        self._freed: dict[int, int] = {}  # slot -> the request that finished there, latest step

    def _add(self, req, arrival):
        return self.engine.add_request(req)

    def _can_step(self):
        return self.engine.has_work()

    def _busy(self):
        return self.engine.has_work()

    def _engine_step(self):
        events = self.engine.step()
        life = self.engine.pop_lifecycle()
        self.timeline.feed(life)
        self._freed = {ev.slot: ev.rid for ev in life if ev.kind == "finished" and ev.slot is not None}
        return events

    def _outcome(self, rid, first, end, times):
        ttft, itl, e2e = self._times(rid, first, end, times)
        track = self.timeline.track(rid)
        spans = tuple(
            (sp.phase, sp.start_s, sp.end_s if sp.end_s is not None else end) for sp in (track.spans if track else ())
        )
        waited = sorted(self.engine.waited(rid).items(), key=lambda kv: -kv[1])
        return RequestOutcome(
            rid, ttft, itl, e2e, self.engine.snapshot().request(rid).preemptions, tuple(waited), spans, **self._who(rid)
        )

    def _finished(self):
        return [(v.rid, v.first_token_s, v.finish_s) for v in self.engine.snapshot().requests if v.state == "finished"]

    def view(self) -> LaneView:
        self._release()  # what has arrived by now is waiting, not arriving
        snap = self.engine.snapshot()
        rows = []
        for sv in snap.slots:
            if sv.free:
                rid = self._freed.get(sv.slot)
                rows.append(RowView(rid, "free" if rid is None else "done"))
            elif sv.prefill_left:
                rows.append(RowView(sv.rid, "prefill", sv.context_len, sv.context_len + sv.prefill_left))
            else:
                v = snap.request(sv.rid)
                rows.append(RowView(sv.rid, "running", len(v.tokens), v.max_new_tokens))
        firsts = [(v.rid, v.first_token_s) for v in snap.requests if v.first_token_s is not None]
        return self._view(
            rows,
            len(snap.queue),
            snap.counters.finished,
            snap.counters.generated_tokens,
            firsts,
            snap.kv.used_tokens,
            snap.kv.reserved_tokens,
            self._note(),
        )
