"""Continuous batching: requests join and leave a running batch of S slots, step by step.

Two schedulers share this engine's API (add_request / step / abort / snapshot):

- the seed's (``chunked_prefill=False``, either cache): every step admits queued requests into
  free slots with one padded prefill for the newcomers, then every slot decodes one token
  together (idle slots compute a throwaway row);
- the token-budget scheduler (``chunked_prefill=True``, paged cache only; ``scheduler.py``):
  every step is ONE forward pass over a flattened batch of at most ``max_batched_tokens``
  tokens: each running request's next token, then chunks of prompts being prefilled
  (``ragged.py``). Long prompts are spread over steps instead of stalling the decodes.

Correctness: under greedy decoding each request's tokens equal its solo ``generate()`` output.
"""

from __future__ import annotations

import time
from collections import deque

import torch

from tinyllm.model.config import default_kv_blocks
from tinyllm.kv.ragged import RaggedAttention
from tinyllm.engine.sampler import sample_rows
from tinyllm.engine.scheduler import TokenBudgetScheduler
from tinyllm.engine.sequence import Event, Sequence, is_done
from tinyllm.engine.static import kv_bytes_per_token, prefill_padded
from tinyllm.model.device import autocast
from tinyllm.kv.dense import SlotKVCache
from tinyllm.model.transformer import Transformer
from tinyllm.request import DEFAULT_MAX_BATCHED_TOKENS, Request, Result, Sampling, check_fits, is_int
from tinyllm.observe.snapshot import Counters, EngineSnapshot, KVView, LifecycleEvent, RequestView, SlotView
from tinyllm.observe.stats import Stats

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
    chunked_prefill (kv="paged" only): the token-budget scheduler (see the module docstring),
    with at most max_batched_tokens tokens per step (default DEFAULT_MAX_BATCHED_TOKENS; at
    least n_slots, so every running request decodes every step).

    One bad request never stops the others: a request whose admission or sampling fails ends
    in state "failed" (its slot freed, the reason in its view and a "failed" lifecycle event);
    everything else keeps running. Besides token Events, the engine records what happens to
    each request as LifecycleEvents (queued, admitted, preempted, finished, aborted, failed):
    ``pop_lifecycle()`` hands them over.
    """

    def __init__(self, model: Transformer, n_slots: int, max_len: int | None = None,
                 temperature: float = 0.0, top_k=None, top_p=None, generator=None,
                 kv: str = "slots", block_size: int = 16, kv_blocks: int | None = None,
                 cuda_graph=False, buckets: tuple[int, ...] | None = None,
                 chunked_prefill: bool = False, max_batched_tokens: int | None = None,
                 prefix_cache: bool | None = None):
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
        if not isinstance(chunked_prefill, bool):
            raise ValueError(f"chunked_prefill must be True or False, got {chunked_prefill!r}")
        if chunked_prefill and kv != "paged":
            raise ValueError("chunked_prefill needs kv='paged' (the token-budget scheduler allocates blocks)")
        prefix_cache = chunked_prefill if prefix_cache is None else prefix_cache
        if not isinstance(prefix_cache, bool):
            raise ValueError(f"prefix_cache must be True, False or None (on with chunked prefill), got {prefix_cache!r}")
        if prefix_cache and not chunked_prefill:
            raise ValueError("prefix_cache needs chunked_prefill=True (the token-budget scheduler looks prefixes up)")
        budget = DEFAULT_MAX_BATCHED_TOKENS if max_batched_tokens is None else max_batched_tokens
        if chunked_prefill and (not is_int(budget) or budget < n_slots):
            raise ValueError(f"max_batched_tokens must be an integer >= n_slots ({n_slots}: every running "
                             f"request decodes each step), got {max_batched_tokens!r}")
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
            from tinyllm.kv.paged import PagedKVCache
            if not is_int(block_size) or block_size < 1:
                raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
            n_blocks = default_kv_blocks(n_slots, max_len, block_size) if kv_blocks is None else kv_blocks
            if not is_int(n_blocks) or n_blocks < 1:
                raise ValueError(f"kv_blocks must be an integer >= 1, got {kv_blocks!r}")
            slots = PagedKVCache(cfg.n_layers, n_slots, cfg.n_kv_heads, cfg.head_dim, n_blocks,
                                 block_size, max_len, dtype, device)
        if cuda_graph is True:
            from tinyllm.kv.cuda_graph import SlotGraphDecoder
            self.decoder = SlotGraphDecoder(model, slots, buckets=buckets)
        self.slots = slots
        self.scheduler = TokenBudgetScheduler(slots, budget) if chunked_prefill else None
        if chunked_prefill:
            slots.prefix_cache = prefix_cache
        self.prefix_cache = prefix_cache
        self._prefix_queries = self._prefix_hits = 0
        self.max_batched_tokens = budget if chunked_prefill else None
        self._running: list[Sequence] = []              # chunked: admission order (newest last)
        self.stats = Stats(kv_bytes_per_token=kv_bytes_per_token(model, device),
                           kv_reserved_tokens=slots.reserved_tokens())
        self.results: dict[int, Result] = {}              # finished, until the caller pops them
        self._seqs: dict[int, Sequence] = {}                  # every request, kept for snapshots
        self._next_rid = 0                                    # (until forget_ended drops old ones)
        self._slot_seq: list[Sequence | None] = [None] * n_slots
        self._queue: deque[Sequence] = deque()
        self._last_tok = torch.zeros(n_slots, 1, dtype=torch.long, device=device)
        self._just_admitted: set[int] = set()
        self._lifecycle: list[LifecycleEvent] = []     # since the last pop_lifecycle()
        self._steps = self._prefills = self._generated = 0
        self._finished = self._aborted = self._failed = 0
        self._t0 = time.perf_counter()
        self._held_at: float | None = None                    # hold_clock: when the clock stopped
        self._held_s = 0.0                                    # time the clock stood still, in all

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
        if not isinstance(req, Request):
            raise ValueError(f"add_request needs a Request, got {type(req).__name__}")
        req = req.frozen()                                # re-validated, prompt as a tuple
        vocab = self.model.cfg.vocab_size
        bad = next((t for t in req.prompt if t >= vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the model's vocabulary [0, {vocab})")
        check_fits(len(req.prompt), req.max_new_tokens, self.max_len, "the slot's max_len")
        self.slots.check_fits(len(req.prompt) + req.max_new_tokens)   # paged: the whole pool, alone
        rid = self._next_rid
        self._next_rid += 1
        seq = Sequence(rid, req, req.sampling or self.sampling, self.now())
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

    def clear_prefix_cache(self) -> int:
        """Forget every cached prefix (blocks in use keep their K/V, but no new request will
        match them). Returns how many free cached blocks became plain free blocks."""
        return self.slots.clear_prefix_cache() if self.prefix_cache else 0

    def forget_ended(self, keep: int) -> int:
        """Drop all but the newest ``keep`` ended (finished, aborted, failed) requests, and their
        unclaimed results: a long-running server would otherwise keep every request it ever
        served, and each snapshot would list them all. Returns how many were dropped."""
        ended = [rid for rid, q in self._seqs.items() if q.state in ("finished", "aborted", "failed")]
        drop = ended[:max(0, len(ended) - keep)]
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
        """Admit what fits, decode one token per active slot. Returns the new tokens."""
        self._steps += 1
        self._just_admitted = set()
        if self.scheduler is not None:
            return self._step_chunked()
        events = self._admit()
        slots = self.slots
        for s in slots.reserve_step():                    # paged: out of blocks → preempt newest
            self._preempted(self._slot_seq[s], s)
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
        nxt, failed = sample_rows(logits[:, -1], rows, self.generator)               # idle rows: engine default
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

    def _step_chunked(self) -> list[Event]:
        """One forward over this step's plan: decodes and prefill chunks in one flattened batch.
        If that forward raises, each item is retried alone, so only the request that breaks it
        fails (the others go on, as in the seed path's admissions)."""
        plan = self.scheduler.plan(self._running, self._queue, self.slots.free_slots())
        for seq in plan.preempted:
            self._preempted(seq, seq.slot)
        self._prefix_queries += plan.prefix_queries
        self._prefix_hits += plan.prefix_hits
        for seq in plan.admitted:                         # the scheduler set slot, computed, cached_tokens
            self._running.append(seq)
            self._slot_seq[seq.slot] = seq
            seq.state, seq.view, seq.prefilled = "running", None, False
            self._just_admitted.add(seq.slot)
            again = f"recompute after {seq.preemptions} preemption(s)" if seq.preemptions else ""
            self._note("admitted", seq, seq.slot, len(seq.req.prompt) + len(seq.out), again, seq.cached_tokens)
        if not plan.items:
            return []
        st = self.stats
        st.decode_steps += 1
        st.peak_active = max(st.peak_active, len(self._running))
        try:
            groups = [(plan.items, self._forward(plan.items))]
        except Exception as e:                            # noqa: BLE001 - isolate the culprit below
            groups = []
            for item in plan.items if len(plan.items) > 1 else ():
                try:
                    groups.append(([item], self._forward([item])))
                except Exception as e1:                   # noqa: BLE001 - this request alone fails
                    self._fail(item[0], f"step failed: {type(e1).__name__}: {e1}")
            if len(plan.items) == 1:
                self._fail(plan.items[0][0], f"step failed: {type(e).__name__}: {e}")
        events: list[Event] = []
        for items, logits in groups:
            events += self._commit(items, logits)
        used = self.slots.used_tokens()
        st.kv_used_frac.append(used / self.slots.reserved_tokens())
        st.kv_alloc_frac.append(used / max(1, self.slots.allocated_tokens()))
        return events

    def _forward(self, items: list[tuple[Sequence, int, int]]):
        """The model over ``items`` as one ragged batch; logits (1, S, V) at the positions that
        sample (each item whose context is then complete). No engine state changes here."""
        flat, sample_at = [], []
        for seq, start, n in items:
            ctx = seq.context()
            flat += ctx[start:start + n]
            if start + n == len(ctx):                     # context complete: its last logits sample
                sample_at.append(len(flat) - 1)
        attn = RaggedAttention(self.slots, [(seq.slot, start, n) for seq, start, n in items])
        idx = torch.tensor([flat], dtype=torch.long, device=self.device)
        at = torch.tensor(sample_at, dtype=torch.long, device=self.device)
        with autocast(self.device):
            logits, _ = self.model(idx, cache=attn, logits_at=at)
        return logits

    def _commit(self, items: list[tuple[Sequence, int, int]], logits) -> list[Event]:
        """After a forward over ``items``: their progress, prefill events, sampled tokens."""
        samplers = []
        self.stats.computed_rows += len(items)
        self.stats.useful_rows += len(items)
        for seq, start, n in items:
            total = len(seq.req.prompt) + len(seq.out)
            if not seq.prefilled:
                self._prefills += 1
                self.stats.prefill_tokens += n
                self._note("prefill", seq, seq.slot, n, f"{start}..{start + n} of {total}")
            seq.computed = start + n
            if self.prefix_cache and seq.computed // self.slots.block_size > len(self.slots.slot_keys[seq.slot]):
                self.slots.register_full(seq.slot, seq.context())   # newly full blocks join the cache
            if seq.computed == total:
                samplers.append(seq)
        if not samplers:
            return []
        nxt, failed = sample_rows(logits[0], [q.sampling for q in samplers], self.generator)
        toks = nxt.squeeze(-1).tolist()
        now = self.now()
        events = []
        for i, seq in enumerate(samplers):
            if i in failed:
                self._fail(seq, failed[i])
                continue
            seq.prefilled = True
            events.append(self._record(seq, toks[i], now))
        return events

    def _preempted(self, seq: Sequence, slot: int) -> None:
        """``seq`` lost its slot and blocks (already released): back to the front of the queue,
        to be recomputed later from its context (prompt + generated so far)."""
        self._slot_seq[slot] = None
        if seq in self._running:
            self._running.remove(seq)
        seq.slot, seq.state, seq.view, seq.computed = None, "preempted", None, 0
        seq.preemptions += 1
        self._queue.appendleft(seq)
        self.stats.preemptions += 1
        self._note("preempted", seq, slot, len(seq.context()), "out of KV blocks")

    def snapshot(self) -> EngineSnapshot:
        """Plain immutable state for viewers. O(slots + blocks + requests); unchanged requests
        reuse their cached views, so token tuples are rebuilt only for requests that moved."""
        slots = self.slots
        lens = slots.context_lens()
        tables = slots.block_tables() if hasattr(slots, "block_tables") else [()] * self.n_slots
        chunked = self.scheduler is not None
        slot_views = tuple(
            SlotView(s, q.rid if q is not None else None, lens[s] if q is not None else 0, self.max_len,
                     tuple(tables[s]), s in self._just_admitted,
                     q.remaining() if chunked and q is not None and not q.prefilled else 0)
            for s, q in enumerate(self._slot_seq))
        reqs = tuple(self._view(q) for q in self._seqs.values())
        kv = KVView(self.kv_kind, slots.reserved_tokens(), slots.allocated_tokens(), slots.used_tokens(),
                    self.stats.kv_bytes_per_token)
        if self.kv_kind == "paged":
            owner_slot = slots.block_owners()
            owners = tuple(self._slot_seq[o].rid if o is not None and self._slot_seq[o] is not None else None
                           for o in owner_slot)
            kv = KVView(kv.kind, kv.reserved_tokens, kv.allocated_tokens, kv.used_tokens, kv.bytes_per_token,
                        slots.block_size, slots.n_blocks, slots.num_free_blocks(), owners, tuple(slots.ref),
                        tuple(k is not None for k in slots.block_key) if self.prefix_cache else (),
                        slots.cached_free_blocks())
        st = self.stats
        counters = Counters(
            steps=self._steps, decode_steps=st.decode_steps, prefills=self._prefills,
            prefill_tokens=self.stats.prefill_tokens, preemptions=st.preemptions, peak_active=st.peak_active,
            useful_tokens=st.useful_tokens, generated_tokens=self._generated, finished=self._finished,
            aborted=self._aborted, failed=self._failed, prefix_queries=self._prefix_queries,
            prefix_hits=self._prefix_hits, computed_rows=st.computed_rows, useful_rows=st.useful_rows)
        return EngineSnapshot(self.now(), self.n_slots, self.max_len, slot_views, reqs,
                              tuple(q.rid for q in self._queue), kv, counters, self.max_batched_tokens)

    # -- internals -------------------------------------------------------------
    def _admit(self) -> list[Event]:
        """Move queued requests into free slots with one padded prefill; sample their first token.
        If that prefill raises, each request is retried alone, so only the culprit fails."""
        slots, q = self.slots, self._queue
        free = slots.free_slots()
        batch: list[Sequence] = []
        while q and len(batch) < len(free) and slots.can_admit([len(x.context()) for x in batch + [q[0]]]):
            batch.append(q.popleft())
        if not batch:
            return []
        taken = free[:len(batch)]
        try:
            return self._admit_into(batch, taken, self._prefill(batch))
        except Exception as e:                            # noqa: BLE001 - isolate the culprit below
            if len(batch) == 1:
                self._fail(batch[0], f"admission failed: {type(e).__name__}: {e}")
                return []
        events = []                                       # one of them broke the batch: try each alone
        for seq, s in zip(batch, taken):
            try:
                done = self._prefill([seq])
            except Exception as e:                        # noqa: BLE001 - this request alone fails
                self._fail(seq, f"admission failed: {type(e).__name__}: {e}")
                continue
            events += self._admit_into([seq], [s], done)
        return events

    def _prefill(self, batch: list[Sequence]):
        """One padded prefill and the first tokens for ``batch``; no engine state changes, so a
        failure here leaves nothing to undo."""
        contexts = [x.context() for x in batch]
        logits, pre, pad = prefill_padded(self.model, contexts, max_len=max(len(c) for c in contexts))
        nxt, failed = sample_rows(logits, [x.sampling for x in batch], self.generator)
        return contexts, pre, pad, nxt, failed

    def _admit_into(self, batch: list[Sequence], taken: list[int], prefilled) -> list[Event]:
        """Put a prefilled batch into slots ``taken``; first tokens as Events."""
        contexts, pre, pad, nxt, failed = prefilled
        self._prefills += 1
        self.stats.prefill_tokens += sum(len(c) for c in contexts)
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
            n = len(contexts[i])                      # the whole context, in this one step
            self._note("prefill", seq, s, n, f"0..{n} of {n}")
            if i in failed:
                self._fail(seq, failed[i])
            else:
                events.append(self._record(seq, t, now))
        return events

    def _record(self, seq: Sequence, tok: int, now: float) -> Event:
        seq.out.append(tok)
        seq.view = None
        self._generated += 1
        if len(seq.out) == 1:
            seq.first_token = now
            self._note("first_token", seq, seq.slot, 1)
        done = is_done(seq.req, seq.out)
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

    def _fail(self, seq: Sequence, why: str) -> None:
        """Give up on one request (its slot freed, the reason kept); the others go on."""
        slot = seq.slot
        if slot is not None:
            self._free_slot(seq)
        seq.error = why
        self._end(seq, "failed", self.now())
        self._failed += 1
        self._note("failed", seq, slot, len(seq.out), why)

    def _note(self, kind: str, seq: Sequence, slot: int | None = None, tokens: int = 0, reason: str = "",
              cached: int = 0) -> None:
        self._lifecycle.append(LifecycleEvent(kind, seq.rid, self._steps, self.now(), slot, tokens, reason, cached))

    def _free_slot(self, seq: Sequence) -> None:
        if seq in self._running:
            self._running.remove(seq)
        self._slot_seq[seq.slot] = None
        self.slots.release(seq.slot)
        seq.slot = None

    @staticmethod
    def _end(seq: Sequence, state: str, now: float) -> None:
        seq.state, seq.finish, seq.view = state, now, None

    def _view(self, seq: Sequence) -> RequestView:
        if seq.view is None:
            r = seq.req
            seq.view = RequestView(seq.rid, seq.state, seq.slot, r.prompt, tuple(seq.out),
                                   r.max_new_tokens, seq.sampling, r.eos_id, seq.arrival, seq.first_token,
                                   seq.finish, seq.preemptions, seq.error, seq.cached_tokens)
        return seq.view


@torch.no_grad()
def run_continuous(model: Transformer, requests: list[Request], n_slots: int,
                   max_len: int | None = None, temperature: float = 0.0, top_k=None,
                   top_p=None, generator=None, kv: str = "slots", block_size: int = 16,
                   kv_blocks: int | None = None, cuda_graph=False,
                   buckets: tuple[int, ...] | None = None, chunked_prefill: bool = False,
                   max_batched_tokens: int | None = None, prefix_cache: bool | None = None
                   ) -> tuple[list[Result], dict]:
    """Offline continuous batching: every request queued at t=0, run to completion.
    A thin wrapper over ContinuousEngine; see it for kv / cuda_graph."""
    eng = ContinuousEngine(model, n_slots, max_len, temperature, top_k, top_p, generator,
                           kv, block_size, kv_blocks, cuda_graph, buckets, chunked_prefill, max_batched_tokens,
                           prefix_cache)
    t0 = time.perf_counter()
    rids = [eng.add_request(r) for r in requests]
    while eng.has_work():
        eng.step()
    st = eng.stats
    st.kv_allocated_at_end = eng.slots.allocated_tokens()
    st.prefix_cache_queries, st.prefix_cache_hits = eng._prefix_queries, eng._prefix_hits
    st.wall_s = time.perf_counter() - t0
    failed = [v for v in eng.snapshot().requests if v.state == "failed"]
    if failed:
        raise RuntimeError(f"request {failed[0].rid} failed: {failed[0].error}")
    results = [eng.results.pop(r) for r in rids]
    return results, st.summary(results)
