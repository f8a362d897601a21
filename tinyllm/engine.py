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

import math
import time
from collections import deque
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tinyllm.generate import autocast, sample_next
from tinyllm.kv_cache import KVCache, SlotKVCache
from tinyllm.model import Transformer
from tinyllm.snapshot import Counters, EngineSnapshot, KVView, RequestView, SlotView


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class Sampling:
    """How to pick tokens (sample_next's settings). Frozen, so equal settings group together."""
    temperature: float = 0.0             # 0 = greedy
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 1):
            raise ValueError(f"top_k must be an integer >= 1 or None (off), got {self.top_k!r}")
        p = self.top_p
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0):
            raise ValueError(f"top_p must be a number in (0, 1] or None (off), got {p!r}")

    def describe(self) -> str:
        if self.temperature == 0:
            return "greedy"
        parts = [f"T={self.temperature:g}"]
        if self.top_k is not None:
            parts.append(f"k={self.top_k}")
        if self.top_p is not None:
            parts.append(f"p={self.top_p:g}")
        return " ".join(parts)


@dataclass
class Request:
    prompt: list[int]
    max_new_tokens: int
    eos_id: int | None = None
    sampling: Sampling | None = None     # ContinuousEngine only; None = the engine's settings

    def __post_init__(self):
        if not isinstance(self.prompt, (list, tuple)) or not self.prompt:
            raise ValueError("prompt must be a non-empty list of token ids")
        if not all(_is_int(t) and t >= 0 for t in self.prompt):
            bad = next(t for t in self.prompt if not (_is_int(t) and t >= 0))
            raise ValueError(f"prompt token ids must be integers >= 0, got {bad!r}")
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.eos_id is not None and (not _is_int(self.eos_id) or self.eos_id < 0):
            raise ValueError(f"eos_id must be an integer >= 0 or None, got {self.eos_id!r}")
        if self.sampling is not None and not isinstance(self.sampling, Sampling):
            raise ValueError(f"sampling must be a Sampling or None, got {type(self.sampling).__name__}")


@dataclass
class Result:
    tokens: list[int]          # generated tokens only (EOS included if it was produced)
    ttft_s: float              # arrival → first generated token
    latency_s: float           # arrival → last generated token


@dataclass
class Stats:
    wall_s: float = 0.0
    useful_tokens: int = 0     # generated tokens that belong to a finished request
    decode_steps: int = 0
    computed_rows: int = 0     # rows run through decode (incl. finished rows / free slots)
    useful_rows: int = 0       # rows whose output was kept
    kv_reserved_tokens: int = 0            # KV capacity held (max over the run)
    kv_used_frac: list[float] = field(default_factory=list)  # per decode step: real tokens / capacity
    kv_alloc_frac: list[float] = field(default_factory=list)  # per decode step: real tokens / claimed
    kv_bytes_per_token: int = 0
    preemptions: int = 0
    peak_active: int = 0
    kv_allocated_at_end: int = 0           # leak check: must be 0 once every request is done

    def summary(self, results: list[Result]) -> dict:
        lat = sorted(r.latency_s for r in results)
        ttft = sorted(r.ttft_s for r in results)
        return {
            "requests": len(results),
            "wall_s": self.wall_s,
            "useful_tokens": self.useful_tokens,
            "tok_s": self.useful_tokens / self.wall_s if self.wall_s > 0 else 0.0,
            "decode_steps": self.decode_steps,
            "row_util": self.useful_rows / max(1, self.computed_rows),
            "latency_mean_s": sum(lat) / max(1, len(lat)),
            "latency_p95_s": percentile(lat, 0.95),
            "ttft_mean_s": sum(ttft) / max(1, len(ttft)),
            "ttft_p50_s": percentile(ttft, 0.50),
            "ttft_p95_s": percentile(ttft, 0.95),
            "kv_reserved_mib": self.kv_reserved_tokens * self.kv_bytes_per_token / 2**20,
            "kv_used_mean": sum(self.kv_used_frac) / max(1, len(self.kv_used_frac)),
            "kv_used_peak": max(self.kv_used_frac, default=0.0),
            "kv_alloc_used_mean": (sum(self.kv_alloc_frac) / len(self.kv_alloc_frac)
                                   if self.kv_alloc_frac else None),
            "preemptions": self.preemptions,
            "peak_active": self.peak_active,
            "kv_allocated_at_end": self.kv_allocated_at_end,
        }


def percentile(sorted_xs: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 when empty)."""
    if not sorted_xs:
        return 0.0
    return sorted_xs[min(len(sorted_xs) - 1, max(0, math.ceil(q * len(sorted_xs)) - 1))]


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
    if not _is_int(batch_size) or batch_size < 1:
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
        if L + new_max > model.cfg.max_seq_len:
            raise ValueError(f"batch at request {b0}: padded prompt {L} + max_new_tokens {new_max} "
                             f"exceeds max_seq_len {model.cfg.max_seq_len}")
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
    """The engine's record of one request, kept after it ends so viewers can show it."""
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
    view: RequestView | None = None        # cached snapshot view; None when stale

    def context(self) -> list[int]:
        """Prompt plus tokens generated so far (longer than the prompt only after a preemption)."""
        return self.req.prompt + self.out

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
    """

    def __init__(self, model: Transformer, n_slots: int, max_len: int | None = None,
                 temperature: float = 0.0, top_k=None, top_p=None, generator=None,
                 kv: str = "slots", block_size: int = 16, kv_blocks: int | None = None,
                 cuda_graph=False, buckets: tuple[int, ...] | None = None):
        model.eval()
        cfg = model.cfg
        if not _is_int(n_slots) or n_slots < 1:
            raise ValueError(f"n_slots must be an integer >= 1, got {n_slots!r}")
        max_len = cfg.max_seq_len if max_len is None else max_len
        if not _is_int(max_len) or not 2 <= max_len <= cfg.max_seq_len:
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
            if not _is_int(block_size) or block_size < 1:
                raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
            n_blocks = n_slots * math.ceil(max_len / block_size) if kv_blocks is None else kv_blocks
            if not _is_int(n_blocks) or n_blocks < 1:
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
        self._steps = self._prefills = self._prefill_tokens = self._generated = 0
        self._finished = self._aborted = 0
        self._t0 = time.perf_counter()

    # -- public API ------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter() - self._t0

    def add_request(self, req: Request) -> int:
        """Queue a request; returns its id. Raises ValueError at once if it can never run."""
        if not isinstance(req, Request):
            raise ValueError(f"add_request needs a Request, got {type(req).__name__}")
        vocab = self.model.cfg.vocab_size
        bad = next((t for t in req.prompt if t >= vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the model's vocabulary [0, {vocab})")
        need = len(req.prompt) + req.max_new_tokens
        if need > self.max_len:
            raise ValueError(f"prompt {len(req.prompt)} + max_new_tokens {req.max_new_tokens} = {need} tokens "
                             f"exceeds slot max_len {self.max_len}")
        self.slots.check_fits(need)                       # paged: the whole pool, alone
        rid = len(self._seqs)
        seq = _Seq(rid, req, req.sampling or self.sampling, self.now())
        self._seqs[rid] = seq
        self._queue.append(seq)
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
        Returns False if it is unknown or already ended. No Result is kept."""
        seq = self._seqs.get(rid)
        if seq is None or seq.state in ("finished", "aborted"):
            return False
        if seq in self._queue:
            self._queue.remove(seq)
        if seq.slot is not None:
            self._free_slot(seq)
        self._end(seq, "aborted", self.now())
        self._aborted += 1
        return True

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
        self._last_tok = self._sample(logits[:, -1], rows)            # idle rows: engine default
        toks = self._last_tok.squeeze(-1).tolist()
        now = self.now()
        for s in live:
            events.append(self._record(self._slot_seq[s], toks[s], now))
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
        counters = Counters(self._steps, st.decode_steps, self._prefills, self._prefill_tokens, st.preemptions,
                            st.peak_active, st.useful_tokens, self._generated, self._finished, self._aborted,
                            st.computed_rows, st.useful_rows)
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
        contexts = [x.context() for x in batch]
        logits, pre, pad = prefill_padded(self.model, contexts, max_len=max(len(c) for c in contexts))
        self._prefills += 1
        self._prefill_tokens += sum(len(c) for c in contexts)
        nxt = self._sample(logits, [x.sampling for x in batch])
        taken = free[:len(batch)]
        slots.admit(taken, pre, pad)
        self._last_tok[torch.tensor(taken, device=self.device)] = nxt
        toks = nxt.squeeze(-1).tolist()
        now = self.now()
        events = []
        for s, seq, t in zip(taken, batch, toks):
            self._slot_seq[s] = seq
            seq.slot, seq.state, seq.view = s, "running", None
            self._just_admitted.add(s)
            events.append(self._record(seq, t, now))
        return events

    def _sample(self, logits: Tensor, rows: list[Sampling]) -> Tensor:
        """Next token per row (B, V) → (B, 1), each row with its own settings. One
        sample_next call per distinct setting, in order of first appearance."""
        groups: dict[Sampling, list[int]] = {}
        for i, s in enumerate(rows):
            groups.setdefault(s, []).append(i)
        if len(groups) == 1:
            (s,) = groups
            return sample_next(logits, s.temperature, s.top_k, s.top_p, self.generator)
        out = torch.empty(logits.size(0), 1, dtype=torch.long, device=logits.device)
        for s, idx in groups.items():
            ix = torch.tensor(idx, device=logits.device)
            out[ix] = sample_next(logits[ix], s.temperature, s.top_k, s.top_p, self.generator)
        return out

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
            self._free_slot(seq)
            self._end(seq, "finished", now)
        return Event(seq.rid, tok, done)

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
            seq.view = RequestView(seq.rid, seq.state, seq.slot, tuple(r.prompt), tuple(seq.out),
                                   r.max_new_tokens, seq.sampling, r.eos_id, seq.arrival, seq.first_token,
                                   seq.finish, seq.preemptions)
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
    results = [eng.results.pop(r) for r in rids]
    return results, st.summary(results)
