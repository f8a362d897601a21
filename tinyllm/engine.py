"""Serving many requests: static batching vs continuous batching, slot or paged KV.

- ``run_static``: take requests in order, B at a time. Left-pad the prompts, prefill once, decode
  until the batch's *longest* request is done. Rows that finish early keep computing (wasted
  work), and the next batch waits for the slowest row.
- ``ContinuousEngine`` / ``run_continuous``: S slots. Every step, queued requests are admitted
  into free slots (one batched, padded prefill for the newcomers), then every slot decodes one
  token together. A finished request frees its slot at once.

Correctness: under greedy decoding each request's tokens equal its solo ``generate()`` output.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tinyllm.config import default_kv_blocks
from tinyllm.generate import autocast, sample_next
from tinyllm.kv_cache import KVCache, SlotKVCache
from tinyllm.model import Transformer
from tinyllm.request import Request, Result, Sampling, ContextTooLong, check_fits, is_int  # noqa: F401 (re-exported)
from tinyllm.snapshot import Counters, EngineSnapshot, KVView, LifecycleEvent, RequestView, SlotView
from tinyllm.stats import Stats, percentile  # noqa: F401 (re-exported)


def kv_bytes_per_token(model: Transformer, device: torch.device) -> int:
    elem = 2 if device.type == "cuda" else 4          # bf16 under autocast, else fp32
    return sum(layer.self_attn.cache_bytes_per_token(elem) for layer in model.layers)


@torch.no_grad()
def prefill_padded(model: Transformer, prompts: list[list[int]], max_len: int,
                   pad_id: int = 0) -> tuple[Tensor, KVCache, list[int]]:
    """Left-pad prompts to one length, run one prefill. Returns last-position logits (B, V),
    the filled cache (pos = padded length) and each row's pad count."""
    device = next(model.parameters()).device
    L = max(len(p) for p in prompts)
    pad = [L - len(p) for p in prompts]
    idx = torch.tensor([[pad_id] * n + list(p) for n, p in zip(pad, prompts)], device=device)
    cache = KVCache(model.cfg.n_layers, max_len, pad_lens=torch.tensor(pad, device=device))
    with autocast(device):
        logits, _ = model(idx, cache=cache)
    return logits[:, -1], cache, pad


def _done(req: Request, toks: list[int]) -> bool:
    return len(toks) >= req.max_new_tokens or (req.eos_id is not None and toks[-1] == req.eos_id)


@torch.no_grad()
def run_static(model: Transformer, requests: list[Request], batch_size: int,
               temperature: float = 0.0, top_k=None, top_p=None, generator=None,
               ) -> tuple[list[Result], dict]:
    """Static batching: B requests at a time, each batch decoded until its longest row is done."""
    if any(r.sampling is not None for r in requests):
        raise ValueError("run_static uses one sampling setting; per-request sampling needs ContinuousEngine")
    if not is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    Sampling(temperature, top_k, top_p)                 # validate once, with the usual messages
    model.eval()
    device = next(model.parameters()).device
    pick = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    stats = Stats(kv_bytes_per_token=kv_bytes_per_token(model, device))
    results: list[Result | None] = [None] * len(requests)
    t0 = time.perf_counter()
    for b0 in range(0, len(requests), batch_size):
        batch = requests[b0:b0 + batch_size]
        L = max(len(r.prompt) for r in batch)
        new_max = max(r.max_new_tokens for r in batch)
        try:
            check_fits(L, new_max, model.cfg.max_seq_len, "the model's max_seq_len")
        except ContextTooLong as e:
            raise ContextTooLong(f"batch at request {b0} (prompts left-padded to {L}): {e}") from None
        logits, cache, _ = prefill_padded(model, [r.prompt for r in batch], L + new_max)
        capacity = len(batch) * (L + new_max)
        stats.kv_reserved_tokens = max(stats.kv_reserved_tokens, capacity)
        outs: list[list[int]] = [[] for _ in batch]
        ttft = [0.0] * len(batch)
        done = [False] * len(batch)
        while True:
            nxt = sample_next(logits, **pick)
            toks = nxt.squeeze(-1).tolist()                      # GPU sync: tokens to the host
            now = time.perf_counter() - t0
            for j, (r, t) in enumerate(zip(batch, toks)):
                if done[j]:
                    continue
                outs[j].append(t)
                if len(outs[j]) == 1:
                    ttft[j] = now
                if _done(r, outs[j]):
                    done[j] = True
                    results[b0 + j] = Result(outs[j], ttft[j], now)
            if all(done):
                break
            live = [j for j in range(len(batch)) if not done[j]]
            stats.decode_steps += 1
            stats.computed_rows += len(batch)
            stats.useful_rows += len(live)
            stats.kv_used_frac.append(sum(len(batch[j].prompt) + len(outs[j]) for j in live) / capacity)
            with autocast(device):
                logits, _ = model(nxt, cache=cache)
            logits = logits[:, -1]
    stats.wall_s = time.perf_counter() - t0
    stats.useful_tokens = sum(len(r.tokens) for r in results)
    return results, stats.summary(results)


@dataclass(frozen=True)
class Event:
    """One generated token, as step() reports it (a server streams these)."""
    rid: int
    token: int
    done: bool                 # the request finished with this token (EOS or max_new_tokens)


@dataclass(eq=False)
class _Seq:
    """The engine's record of one request, kept after it ends so viewers can show it.
    ``req`` is the engine's own frozen copy (prompt as a tuple), never the caller's object."""
    rid: int
    req: Request
    sampling: Sampling
    arrival: float
    out: list[int] = field(default_factory=list)
    state: str = "queued"
    slot: int | None = None
    first_token: float | None = None
    finish: float | None = None
    preemptions: int = 0
    error: str | None = None
    view: RequestView | None = None        # cached snapshot view; None when stale

    def context(self) -> list[int]:
        """Prompt plus tokens generated so far (longer than the prompt only after a preemption)."""
        return [*self.req.prompt, *self.out]

    def left(self) -> int:
        return self.req.max_new_tokens - len(self.out)


class ContinuousEngine:
    """run_continuous's loop as an object, so requests can arrive while others decode.
    add_request() queues a request at any time; each step() admits queued requests into free
    slots (one padded prefill), decodes one token for every active slot and returns the new
    tokens as Events. A finished request's Result is in ``results`` (pop it).

    Times are seconds on the engine clock (since construction); TTFT and latency count from the
    request's arrival. Sampling: the engine's settings are the default; a request's
    ``sampling`` overrides them. Rows with equal settings are sampled in one call. One generator
    is shared by all rows. Not thread-safe: call add_request / step / abort from one thread.

    kv="slots": SlotKVCache, every slot reserves max_len positions.
    kv="paged": PagedKVCache with kv_blocks blocks of block_size tokens (default: the same
    memory as the slot cache). When a decode step needs a block and none is free, the newest
    running request is preempted and later recomputed from prompt + generated tokens.
    cuda_graph (CUDA, kv="slots" only): the decode step is replayed as a CUDA graph per
    attention-window bucket (cuda_graph.SlotGraphDecoder); True builds one, or pass a decoder
    to reuse its cache and captured graphs.

    One bad request never stops the others: a request whose admission or sampling fails ends
    in state "failed" (its slot freed, the reason in its view and a "failed" lifecycle event);
    everything else keeps running. Besides token Events, the engine records what happens to
    each request as LifecycleEvents (queued, admitted, preempted, finished, aborted, failed):
    ``pop_lifecycle()`` hands them over.
    """

    def __init__(self, model: Transformer, n_slots: int, max_len: int | None = None,
                 temperature: float = 0.0, top_k=None, top_p=None, generator=None,
                 kv: str = "slots", block_size: int = 16, kv_blocks: int | None = None,
                 cuda_graph=False, buckets: tuple[int, ...] | None = None):
        model.eval()
        cfg = model.cfg
        if not is_int(n_slots) or n_slots < 1:
            raise ValueError(f"n_slots must be an integer >= 1, got {n_slots!r}")
        max_len = cfg.max_seq_len if max_len is None else max_len
        if not is_int(max_len) or not 2 <= max_len <= cfg.max_seq_len:
            raise ValueError(f"max_len must be an integer in [2, {cfg.max_seq_len}] "
                             f"(the model's max_seq_len), got {max_len!r}")
        if kv not in ("slots", "paged"):
            raise ValueError(f"kv must be 'slots' or 'paged', got {kv!r}")
        if cuda_graph is not False and kv != "slots":
            raise ValueError("cuda_graph supports kv='slots' only (paged: not yet)")
        self.model = model
        self.device = device = next(model.parameters()).device
        self.n_slots = n_slots
        self.max_len = max_len
        self.sampling = Sampling(temperature, top_k, top_p)    # the default for every request
        self.generator = generator
        self.kv_kind = kv
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.decoder = None
        if cuda_graph is not False and not isinstance(cuda_graph, bool):   # a SlotGraphDecoder
            self.decoder, slots = cuda_graph, cuda_graph.slots
            if slots.n_slots != n_slots or slots.max_len != max_len or any(slots.active):
                raise ValueError(f"decoder cache has {slots.n_slots} slots of {slots.max_len} "
                                 f"(active: {sum(slots.active)}); need {n_slots} idle slots of {max_len}")
        elif kv == "slots":
            slots = SlotKVCache(cfg.n_layers, n_slots, cfg.n_kv_heads, cfg.head_dim, max_len, dtype, device)
        else:
            from tinyllm.paged_kv import PagedKVCache
            if not is_int(block_size) or block_size < 1:
                raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
            n_blocks = default_kv_blocks(n_slots, max_len, block_size) if kv_blocks is None else kv_blocks
            if not is_int(n_blocks) or n_blocks < 1:
                raise ValueError(f"kv_blocks must be an integer >= 1, got {kv_blocks!r}")
            slots = PagedKVCache(cfg.n_layers, n_slots, cfg.n_kv_heads, cfg.head_dim, n_blocks,
                                 block_size, max_len, dtype, device)
        if cuda_graph is True:
            from tinyllm.cuda_graph import SlotGraphDecoder
            self.decoder = SlotGraphDecoder(model, slots, buckets=buckets)
        self.slots = slots
        self.stats = Stats(kv_bytes_per_token=kv_bytes_per_token(model, device),
                           kv_reserved_tokens=slots.reserved_tokens())
        self.results: dict[int, Result] = {}              # finished, until the caller pops them
        self._seqs: dict[int, _Seq] = {}                  # every request, kept for snapshots
        self._slot_seq: list[_Seq | None] = [None] * n_slots
        self._queue: deque[_Seq] = deque()
        self._last_tok = torch.zeros(n_slots, 1, dtype=torch.long, device=device)
        self._just_admitted: set[int] = set()
        self._lifecycle: list[LifecycleEvent] = []     # since the last pop_lifecycle()
        self._steps = self._prefills = self._prefill_tokens = self._generated = 0
        self._finished = self._aborted = self._failed = 0
        self._t0 = time.perf_counter()

    # -- public API ------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter() - self._t0

    @property
    def steps(self) -> int:
        """step() calls so far (the step number lifecycle events carry)."""
        return self._steps

    def add_request(self, req: Request) -> int:
        """Queue a request; returns its id. Raises ValueError at once if it can never run.
        The engine keeps its own immutable copy: later changes to ``req`` change nothing."""
        if not isinstance(req, Request):
            raise ValueError(f"add_request needs a Request, got {type(req).__name__}")
        req = req.frozen()                                # re-validated, prompt as a tuple
        vocab = self.model.cfg.vocab_size
        bad = next((t for t in req.prompt if t >= vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the model's vocabulary [0, {vocab})")
        check_fits(len(req.prompt), req.max_new_tokens, self.max_len, "the slot's max_len")
        self.slots.check_fits(len(req.prompt) + req.max_new_tokens)   # paged: the whole pool, alone
        rid = len(self._seqs)
        seq = _Seq(rid, req, req.sampling or self.sampling, self.now())
        self._seqs[rid] = seq
        self._queue.append(seq)
        self._note("queued", seq, tokens=len(req.prompt))
        return rid

    def has_work(self) -> bool:
        return bool(self._queue) or any(self.slots.active)

    def load(self) -> tuple[int, int]:
        """(requests waiting for a slot, slots decoding a request)."""
        return len(self._queue), sum(self.slots.active)

    def kv_used_frac(self) -> float:
        return self.slots.used_tokens() / max(1, self.slots.reserved_tokens())

    def abort(self, rid: int) -> bool:
        """Drop an unfinished request (e.g. its client went away), freeing its slot.
        Returns False if it is unknown (any non-id included) or already ended. No Result is kept."""
        seq = self._seqs.get(rid) if is_int(rid) else None
        if seq is None or seq.state in ("finished", "aborted", "failed"):
            return False
        if seq in self._queue:
            self._queue.remove(seq)
        slot = seq.slot
        if slot is not None:
            self._free_slot(seq)
        self._end(seq, "aborted", self.now())
        self._aborted += 1
        self._note("aborted", seq, slot, len(seq.out))
        return True

    def pop_lifecycle(self) -> list[LifecycleEvent]:
        """The lifecycle events recorded since the last call, oldest first."""
        out, self._lifecycle = self._lifecycle, []
        return out

    @torch.no_grad()
    def step(self) -> list[Event]:
        """Admit what fits, decode one token per active slot. Returns the new tokens."""
        self._steps += 1
        self._just_admitted = set()
        events = self._admit()
        slots = self.slots
        for s in slots.reserve_step():                    # paged: out of blocks → preempt newest
            seq = self._slot_seq[s]
            self._slot_seq[s] = None
            seq.slot, seq.state, seq.view = None, "preempted", None
            seq.preemptions += 1
            self._queue.appendleft(seq)                   # recomputed later from its context
            self.stats.preemptions += 1
            self._note("preempted", seq, s, len(seq.context()), "out of KV blocks")
        live = [s for s in range(self.n_slots) if slots.active[s]]
        if not live:
            return events
        st = self.stats
        st.peak_active = max(st.peak_active, len(live))
        st.decode_steps += 1
        st.computed_rows += self.n_slots
        st.useful_rows += len(live)
        used = slots.used_tokens()
        st.kv_used_frac.append(used / slots.reserved_tokens())
        st.kv_alloc_frac.append(used / max(1, slots.allocated_tokens()))
        if self.decoder is not None:
            logits = self.decoder.step(self._last_tok)
        else:
            with autocast(self.device):
                logits, _ = self.model(self._last_tok, cache=slots)   # one token per slot
        rows = [q.sampling if q is not None else self.sampling for q in self._slot_seq]
        nxt, failed = self._sample(logits[:, -1], rows)               # idle rows: engine default
        self._last_tok = nxt
        toks = nxt.squeeze(-1).tolist()
        now = self.now()
        for s in live:
            seq = self._slot_seq[s]
            if s in failed:
                self._fail(seq, failed[s])
            else:
                events.append(self._record(seq, toks[s], now))
        return events

    def snapshot(self) -> EngineSnapshot:
        """Plain immutable state for viewers. O(slots + blocks + requests); unchanged requests
        reuse their cached views, so token tuples are rebuilt only for requests that moved."""
        slots = self.slots
        lens = slots.context_lens()
        tables = slots.block_tables() if hasattr(slots, "block_tables") else [()] * self.n_slots
        slot_views = tuple(
            SlotView(s, q.rid if q is not None else None, lens[s] if q is not None else 0, self.max_len,
                     tuple(tables[s]), s in self._just_admitted)
            for s, q in enumerate(self._slot_seq))
        reqs = tuple(self._view(q) for q in self._seqs.values())
        kv = KVView(self.kv_kind, slots.reserved_tokens(), slots.allocated_tokens(), slots.used_tokens(),
                    self.stats.kv_bytes_per_token)
        if self.kv_kind == "paged":
            owner_slot = slots.block_owners()
            owners = tuple(self._slot_seq[o].rid if o is not None and self._slot_seq[o] is not None else None
                           for o in owner_slot)
            kv = KVView(kv.kind, kv.reserved_tokens, kv.allocated_tokens, kv.used_tokens, kv.bytes_per_token,
                        slots.block_size, slots.n_blocks, slots.num_free_blocks(), owners)
        st = self.stats
        counters = Counters(
            steps=self._steps, decode_steps=st.decode_steps, prefills=self._prefills,
            prefill_tokens=self._prefill_tokens, preemptions=st.preemptions, peak_active=st.peak_active,
            useful_tokens=st.useful_tokens, generated_tokens=self._generated, finished=self._finished,
            aborted=self._aborted, failed=self._failed, computed_rows=st.computed_rows, useful_rows=st.useful_rows)
        return EngineSnapshot(self.now(), self.n_slots, self.max_len, slot_views, reqs,
                              tuple(q.rid for q in self._queue), kv, counters)

    # -- internals -------------------------------------------------------------
    def _admit(self) -> list[Event]:
        """Move queued requests into free slots with one padded prefill; sample their first token."""
        slots, q = self.slots, self._queue
        free = slots.free_slots()
        batch: list[_Seq] = []
        while q and len(batch) < len(free) and slots.can_admit([len(x.context()) for x in batch + [q[0]]]):
            batch.append(q.popleft())
        if not batch:
            return []
        taken = free[:len(batch)]
        try:
            return self._prefill_into(batch, taken)
        except Exception as e:                            # noqa: BLE001 - isolate the culprit below
            if len(batch) == 1:
                self._fail(batch[0], f"admission failed: {type(e).__name__}: {e}")
                return []
        events = []                                       # one of them broke the batch: try each alone
        for seq, s in zip(batch, taken):
            try:
                events += self._prefill_into([seq], [s])
            except Exception as e:                        # noqa: BLE001 - this request alone fails
                self._fail(seq, f"admission failed: {type(e).__name__}: {e}")
        return events

    def _prefill_into(self, batch: list[_Seq], taken: list[int]) -> list[Event]:
        """One padded prefill for ``batch`` into slots ``taken``; first tokens as Events."""
        contexts = [x.context() for x in batch]
        logits, pre, pad = prefill_padded(self.model, contexts, max_len=max(len(c) for c in contexts))
        nxt, failed = self._sample(logits, [x.sampling for x in batch])
        self._prefills += 1
        self._prefill_tokens += sum(len(c) for c in contexts)
        self.slots.admit(taken, pre, pad)
        self._last_tok[torch.tensor(taken, device=self.device)] = nxt
        toks = nxt.squeeze(-1).tolist()
        now = self.now()
        events = []
        for i, (s, seq, t) in enumerate(zip(taken, batch, toks)):
            self._slot_seq[s] = seq
            seq.slot, seq.state, seq.view = s, "running", None
            self._just_admitted.add(s)
            again = f"recompute after {seq.preemptions} preemption(s)" if seq.preemptions else ""
            self._note("admitted", seq, s, len(contexts[i]), again)
            if i in failed:
                self._fail(seq, failed[i])
            else:
                events.append(self._record(seq, t, now))
        return events

    def _sample(self, logits: Tensor, rows: list[Sampling]) -> tuple[Tensor, dict[int, str]]:
        """Next token per row (B, V) → (B, 1), each row with its own settings, and the rows whose
        sampling failed (row → why; their token is garbage). One sample_next call per distinct
        setting, in order of first appearance, so one bad setting cannot fail the others."""
        groups: dict[Sampling, list[int]] = {}
        for i, s in enumerate(rows):
            groups.setdefault(s, []).append(i)
        failed: dict[int, str] = {}
        if len(groups) == 1:
            (s,) = groups
            try:
                return sample_next(logits, s.temperature, s.top_k, s.top_p, self.generator), failed
            except Exception as e:                        # noqa: BLE001 - every row shares the setting
                return self._sampling_failed(logits, range(len(rows)), e)
        out = torch.zeros(logits.size(0), 1, dtype=torch.long, device=logits.device)
        for s, idx in groups.items():
            ix = torch.tensor(idx, device=logits.device)
            try:
                out[ix] = sample_next(logits[ix], s.temperature, s.top_k, s.top_p, self.generator)
            except Exception as e:                        # noqa: BLE001 - only this group's rows fail
                failed.update(self._sampling_failed(logits, idx, e)[1])
        return out, failed

    @staticmethod
    def _sampling_failed(logits: Tensor, rows, e: Exception) -> tuple[Tensor, dict[int, str]]:
        why = f"sampling failed: {type(e).__name__}: {e}"
        return torch.zeros(logits.size(0), 1, dtype=torch.long, device=logits.device), {i: why for i in rows}

    def _record(self, seq: _Seq, tok: int, now: float) -> Event:
        seq.out.append(tok)
        seq.view = None
        self._generated += 1
        if len(seq.out) == 1:
            seq.first_token = now
        done = _done(seq.req, seq.out)
        if done:
            self.results[seq.rid] = Result(list(seq.out), seq.first_token - seq.arrival, now - seq.arrival)
            self.stats.useful_tokens += len(seq.out)
            self._finished += 1
            slot = seq.slot
            self._free_slot(seq)
            self._end(seq, "finished", now)
            why = "eos" if seq.req.eos_id is not None and tok == seq.req.eos_id else "length"
            self._note("finished", seq, slot, len(seq.out), why)
        return Event(seq.rid, tok, done)

    def _fail(self, seq: _Seq, why: str) -> None:
        """Give up on one request (its slot freed, the reason kept); the others go on."""
        slot = seq.slot
        if slot is not None:
            self._free_slot(seq)
        seq.error = why
        self._end(seq, "failed", self.now())
        self._failed += 1
        self._note("failed", seq, slot, len(seq.out), why)

    def _note(self, kind: str, seq: _Seq, slot: int | None = None, tokens: int = 0, reason: str = "") -> None:
        self._lifecycle.append(LifecycleEvent(kind, seq.rid, self._steps, self.now(), slot, tokens, reason))

    def _free_slot(self, seq: _Seq) -> None:
        self._slot_seq[seq.slot] = None
        self.slots.release(seq.slot)
        seq.slot = None

    @staticmethod
    def _end(seq: _Seq, state: str, now: float) -> None:
        seq.state, seq.finish, seq.view = state, now, None

    def _view(self, seq: _Seq) -> RequestView:
        if seq.view is None:
            r = seq.req
            seq.view = RequestView(seq.rid, seq.state, seq.slot, r.prompt, tuple(seq.out),
                                   r.max_new_tokens, seq.sampling, r.eos_id, seq.arrival, seq.first_token,
                                   seq.finish, seq.preemptions, seq.error)
        return seq.view


@torch.no_grad()
def run_continuous(model: Transformer, requests: list[Request], n_slots: int,
                   max_len: int | None = None, temperature: float = 0.0, top_k=None,
                   top_p=None, generator=None, kv: str = "slots", block_size: int = 16,
                   kv_blocks: int | None = None, cuda_graph=False,
                   buckets: tuple[int, ...] | None = None) -> tuple[list[Result], dict]:
    """Offline continuous batching: every request queued at t=0, run to completion.
    A thin wrapper over ContinuousEngine; see it for kv / cuda_graph."""
    eng = ContinuousEngine(model, n_slots, max_len, temperature, top_k, top_p, generator,
                           kv, block_size, kv_blocks, cuda_graph, buckets)
    t0 = time.perf_counter()
    rids = [eng.add_request(r) for r in requests]
    while eng.has_work():
        eng.step()
    st = eng.stats
    st.kv_allocated_at_end = eng.slots.allocated_tokens()
    st.wall_s = time.perf_counter() - t0
    failed = [v for v in eng.snapshot().requests if v.state == "failed"]
    if failed:
        raise RuntimeError(f"request {failed[0].rid} failed: {failed[0].error}")
    results = [eng.results.pop(r) for r in rids]
    return results, st.summary(results)
