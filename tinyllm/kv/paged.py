"""Paged KV cache: one pool of fixed-size blocks shared by all slots, claimed as sequences grow.

A slot's context lives in the blocks listed in its block table, in order; memory follows real
use instead of reserving max_len per slot. When a decode step needs a new block and none is
free, ``reserve_step`` evicts the newest running request (its blocks go back to the pool) and
tells the engine, which requeues it for recompute. Same slot interface as ``SlotKVCache``.

Attention gathers each slot's blocks with one indexing op per layer (no Python loop over
tokens or blocks); an extra scratch block absorbs the writes of idle slots.

Automatic prefix caching (``prefix_cache=True``, used by the token-budget scheduler): a full
block's key is hash(parent block's key, its token ids), so a key names a whole prefix. A new
sequence takes the longest chain of cached full blocks that matches its context (reference
count + 1, never the whole context: its last token is always computed, so there are logits to
sample), comparing the stored token ids as well; keys are SHA-256 digests (``prefix_key``).
A block is free for reuse only at zero references; a free block that holds a cached prefix
stays cached (and can be revived) until the pool needs it, least recently freed first.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from array import array
from collections import OrderedDict

import torch
from torch import Tensor

from tinyllm.kv.dense import KVCache
from tinyllm.model.transformer import grouped_attention


def prefix_key(parent: bytes | None, tokens: tuple[int, ...]) -> bytes:
    """A full block's key: SHA-256 of its parent's key and its token ids, so a key names the
    whole prefix up to the block's end. A cryptographic hash, as vLLM moved to after a collision
    advisory (GHSA-rm76-4mrf-v9r8): with Python's 64-bit ``hash`` two different prefixes could
    share a key, and comparing a block's own tokens would not catch a different parent."""
    h = hashlib.sha256(parent or b"")
    h.update(array("q", tokens).tobytes())
    return h.digest()


def gather_blocks(pool: Tensor, blocks: Tensor, block_size: int) -> Tensor:
    """The tokens of ``blocks`` (a flat tensor of block ids), in order: (len(blocks) * block_size,
    Hkv, D). One ``index_select`` over whole blocks: about 5x faster on CPU than indexing the
    same tokens one row each (measured: 70 vs 370 us for 16 rows x 12 blocks of 16)."""
    rows = pool.view(-1, block_size * pool.size(1) * pool.size(2))
    return torch.index_select(rows, 0, blocks).view(-1, pool.size(1), pool.size(2))


class PagedKVCache:
    def __init__(self, n_layers: int, n_slots: int, n_kv_heads: int, head_dim: int, n_blocks: int,
                 block_size: int, max_len: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None):
        if n_blocks < 1 or block_size < 1:
            raise ValueError(f"PagedKVCache needs n_blocks >= 1 and block_size >= 1, got {n_blocks}, {block_size}")
        self.n_layers, self.n_slots, self.max_len = n_layers, n_slots, max_len
        self.n_blocks, self.block_size = n_blocks, block_size
        self.n_kv_heads, self.head_dim = n_kv_heads, head_dim
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.scratch = n_blocks                              # the extra block idle rows write to
        shape = (n_layers, (n_blocks + 1) * block_size, n_kv_heads, head_dim)   # token-major pool
        self.k = torch.zeros(shape, dtype=dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=dtype, device=self.device)
        self.max_blocks = math.ceil(max_len / block_size)
        self.tables: list[list[int]] = [[] for _ in range(n_slots)]
        self.ref = [0] * n_blocks                            # block → how many slots' tables hold it
        self._free: list[int] = list(range(n_blocks))        # a heap: lowest id first (easy to read)
        self.prefix_cache = False                            # set by the engine (chunked prefill only)
        self.block_key: list[bytes | None] = [None] * n_blocks   # a full block's prefix key, if cached
        self.block_tokens: list[tuple[int, ...] | None] = [None] * n_blocks
        self.cached: dict[bytes, int] = {}                   # prefix key → block
        self._lru: OrderedDict[int, None] = OrderedDict()    # cached blocks at zero refs, oldest first
        self.slot_keys: list[list[bytes]] = [[] for _ in range(n_slots)]   # keys of each slot's full blocks
        self.lens = [0] * n_slots
        self.active = [False] * n_slots
        self._order = [0] * n_slots                          # admission order, for "newest"
        self._admissions = 0
        self._dirty = True
        self._table_t = self._lens_t = self._mask = self._write = None
        self._n_win_blocks = 0

    # -- slot interface ---------------------------------------------------------------------
    def free_slots(self) -> list[int]:
        return [s for s in range(self.n_slots) if not self.active[s]]

    def blocks_for(self, n_tokens: int) -> int:
        return math.ceil(n_tokens / self.block_size)

    def check_fits(self, total_tokens: int) -> None:
        """Refuse a request that could not fit the whole pool even alone."""
        need = self.blocks_for(total_tokens)
        if need > self.n_blocks:
            raise ValueError(f"{total_tokens} tokens need {need} blocks of {self.block_size}, "
                             f"but the pool has only {self.n_blocks} blocks ({self.n_blocks * self.block_size} tokens)")

    def can_admit(self, context_lens: list[int]) -> bool:
        """Enough free blocks for every context plus the position its first decode writes."""
        return sum(self.blocks_for(n + 1) for n in context_lens) <= self.num_free_blocks()

    def admit(self, slots: list[int], pre: KVCache, pad: list[int]) -> None:
        for row, (s, p) in enumerate(zip(slots, pad)):
            n = pre.pos - p
            self._grow(s, self.blocks_for(n + 1))
            idx = self._token_index(s, n)
            for layer in range(self.n_layers):
                k, v = pre.real_kv(layer, row, p)                       # (Hkv, n, D)
                self.k[layer, idx] = k.transpose(0, 1).to(self.k.dtype)
                self.v[layer, idx] = v.transpose(0, 1).to(self.v.dtype)
            self.lens[s] = n
            self.active[s] = True
            self._admissions += 1
            self._order[s] = self._admissions
        self._dirty = True

    # -- for the token-budget scheduler (chunked prefill): lens = tokens computed so far -------
    def activate(self, slot: int) -> None:
        """A free slot starts holding a sequence with nothing computed yet."""
        assert not self.active[slot] and not self.tables[slot], f"slot {slot} is not free"
        self.active[slot] = True
        self.lens[slot] = 0
        self._admissions += 1
        self._order[slot] = self._admissions
        self._dirty = True

    def try_grow(self, slot: int, n_tokens: int) -> bool:
        """Blocks for the slot's first ``n_tokens`` positions; False (nothing taken) if short."""
        need = self.blocks_for(n_tokens) - len(self.tables[slot])
        if need > self.num_free_blocks():
            return False
        if need > 0:
            self._grow(slot, len(self.tables[slot]) + need)
        return True

    def room(self, slot: int) -> int:
        """Tokens the slot can still add: the rest of its blocks plus every free block."""
        return len(self.tables[slot]) * self.block_size - self.lens[slot] + self.num_free_blocks() * self.block_size

    def room_fresh(self) -> int:
        """Tokens a newly admitted sequence could take: every free block."""
        return self.num_free_blocks() * self.block_size

    # -- prefix caching ---------------------------------------------------------------------
    def match_prefix(self, tokens: list[int]) -> list[int]:
        """Blocks of the longest cached chain of full blocks that starts ``tokens``, never
        covering all of it (at most (len - 1) // block_size blocks)."""
        if not self.prefix_cache:
            return []
        bs, out, parent = self.block_size, [], None
        for i in range((len(tokens) - 1) // bs):
            toks = tuple(tokens[i * bs:(i + 1) * bs])
            b = self.cached.get(prefix_key(parent, toks))
            if b is None or self.block_tokens[b] != toks:   # a miss, or a collision: stop here
                break
            out.append(b)
            parent = self.block_key[b]
        return out

    def free_blocks_taken_by(self, blocks: list[int]) -> int:
        """How many of these cached blocks sit in the free pool (reviving them uses free room)."""
        return sum(1 for b in blocks if self.ref[b] == 0)

    def take_prefix(self, slot: int, blocks: list[int]) -> None:
        """An activated, empty slot starts with these cached blocks as its first positions."""
        assert not self.tables[slot] and self.lens[slot] == 0
        for b in blocks:
            if self.ref[b] == 0:
                del self._lru[b]                              # revived: keeps its key
            self.ref[b] += 1
            self.tables[slot].append(b)
            self.slot_keys[slot].append(self.block_key[b])
        self.lens[slot] = len(blocks) * self.block_size
        self._dirty = True

    def register_full(self, slot: int, tokens: list[int]) -> None:
        """Blocks of the slot that became full (lens crossed their end) get their prefix key;
        ``tokens`` is the slot's context. A key already cached elsewhere keeps its block."""
        if not self.prefix_cache:
            return
        bs, keys = self.block_size, self.slot_keys[slot]
        for i in range(len(keys), self.lens[slot] // bs):
            toks = tuple(tokens[i * bs:(i + 1) * bs])
            key = prefix_key(keys[-1] if keys else None, toks)
            keys.append(key)
            b = self.tables[slot][i]
            if key not in self.cached and self.block_key[b] is None:
                self.cached[key], self.block_key[b], self.block_tokens[b] = b, key, toks

    def clear_prefix_cache(self) -> int:
        """Forget every cached prefix; returns how many free cached blocks became plain free."""
        n = len(self._lru)
        for b in self._lru:
            heapq.heappush(self._free, b)
        self._lru.clear()
        self.cached.clear()
        self.block_key = [None] * self.n_blocks
        self.block_tokens = [None] * self.n_blocks
        return n

    def cached_free_blocks(self) -> int:
        return len(self._lru)

    def release(self, slot: int) -> None:
        # Last block first: the LRU then evicts a chain from its end, keeping its start (what the
        # next prompt can still match) cached the longest, as vLLM does.
        for b in reversed(self.tables[slot]):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if self.block_key[b] is not None:
                    self._lru[b] = None                       # stays cached until the pool needs it
                else:
                    heapq.heappush(self._free, b)
        self.tables[slot] = []
        self.slot_keys[slot] = []
        self.active[slot] = False
        self.lens[slot] = 0
        self._dirty = True

    def reserve_step(self) -> list[int]:
        """Make sure every active slot has room for the token this step writes. Evicts the newest
        running requests while blocks are short; returns the evicted slots (already released)."""
        evicted: list[int] = []
        while True:
            needy = [s for s in range(self.n_slots)
                     if self.active[s] and self.lens[s] >= len(self.tables[s]) * self.block_size]
            if len(needy) <= self.num_free_blocks():
                break
            victim = max((s for s in range(self.n_slots) if self.active[s]), key=lambda s: self._order[s])
            self.release(victim)
            evicted.append(victim)
        for s in needy:
            self._grow(s, len(self.tables[s]) + 1)
        return evicted

    def used_tokens(self) -> int:
        """Context tokens stored, each once: a shared (prefix-cached, always full) block held by
        r sequences is in each one's length but in memory once."""
        shared = sum(r - 1 for r in self.ref if r > 1) * self.block_size
        return sum(n for n, a in zip(self.lens, self.active) if a) - shared

    def reserved_tokens(self) -> int:
        return self.n_blocks * self.block_size

    def allocated_tokens(self) -> int:
        return (self.n_blocks - self.num_free_blocks()) * self.block_size

    def num_free_blocks(self) -> int:
        """Blocks nobody references: plain free ones and cached ones (evictable)."""
        return len(self._free) + len(self._lru)

    def context_lens(self) -> list[int]:
        return list(self.lens)

    def block_tables(self) -> list[list[int]]:
        return [list(t) for t in self.tables]

    def block_owners(self) -> list[int | None]:
        """Per block, a slot that holds it (the first in slot order; None = free)."""
        out: list[int | None] = [None] * self.n_blocks
        for s, table in enumerate(self.tables):
            for b in table:
                if out[b] is None:
                    out[b] = s
        return out

    # -- AttentionCache protocol (decode: one token per slot) -----------------------------
    def begin(self, batch: int, n_new: int) -> Tensor:
        if batch != self.n_slots or n_new != 1:
            raise ValueError(f"PagedKVCache decodes one token for each of its {self.n_slots} slots, "
                             f"got batch {batch} x {n_new} tokens")
        for s in range(self.n_slots):
            if self.active[s] and self.lens[s] >= len(self.tables[s]) * self.block_size:
                raise RuntimeError(f"slot {s} has no block for position {self.lens[s]}: call reserve_step() first")
        if self._dirty:
            self._sync()
        longest = max((n for n, a in zip(self.lens, self.active) if a), default=0)
        nb = self.blocks_for(longest + 1)
        self._n_win_blocks = nb
        k_pos = torch.arange(nb * self.block_size, device=self.device)
        self._mask = (k_pos[None, :] <= self._lens_t[:, None])[:, None, None, :]
        return self._lens_t[:, None]

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        kl, vl = self.k[layer], self.v[layer]
        kl[self._write] = k[:, :, 0].to(kl.dtype)                  # (S, Hkv, D) at each slot's position
        vl[self._write] = v[:, :, 0].to(vl.dtype)
        S, nb, bs = self.n_slots, self._n_win_blocks, self.block_size
        blocks = self._table_t[:, :nb].reshape(-1)
        keys = gather_blocks(kl, blocks, bs).view(S, nb * bs, *kl.shape[1:]).transpose(1, 2).to(q.dtype)
        vals = gather_blocks(vl, blocks, bs).view(S, nb * bs, *vl.shape[1:]).transpose(1, 2).to(q.dtype)
        return grouped_attention(q, keys, vals, self._mask)

    def end(self, n_new: int) -> None:
        for s in range(self.n_slots):
            if self.active[s]:
                self.lens[s] += 1
        self._dirty = True
        self._mask = None

    # -- internals ------------------------------------------------------------------------
    def _grow(self, slot: int, n_blocks: int) -> None:
        while len(self.tables[slot]) < n_blocks:
            if self._free:
                b = heapq.heappop(self._free)
            else:                                             # evict the least recently freed cached block
                b, _ = self._lru.popitem(last=False)
                del self.cached[self.block_key[b]]
                self.block_key[b] = self.block_tokens[b] = None
            self.ref[b] = 1
            self.tables[slot].append(b)
        self._dirty = True

    def _token_index(self, slot: int, n: int) -> Tensor:
        """Pool rows of a slot's positions 0..n-1."""
        pos = torch.arange(n, device=self.device)
        table = torch.tensor(self.tables[slot], dtype=torch.long, device=self.device)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def _sync(self) -> None:
        """Host tables/lengths → device tensors (once per step, only when something changed)."""
        rows = [t + [self.scratch] * (self.max_blocks - len(t)) for t in self.tables]
        self._table_t = torch.tensor(rows, dtype=torch.long, device=self.device)
        self._lens_t = torch.tensor(self.lens, dtype=torch.long, device=self.device)
        bs = self.block_size
        write = [self.tables[s][self.lens[s] // bs] * bs + self.lens[s] % bs if self.active[s] else self.scratch * bs
                 for s in range(self.n_slots)]
        self._write = torch.tensor(write, dtype=torch.long, device=self.device)
        self._dirty = False
