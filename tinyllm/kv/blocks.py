"""Block bookkeeping for the paged KV cache: which blocks each slot holds, reference counts, the
free heap, and the prefix cache's keys. Plain Python, no tensors: a scheduler plans a step on it
(vLLM's ``KVCacheManager`` / ``BlockPool``, nano-vllm's ``BlockManager``), and ``PagedKVCache``
(paged.py) adds the K/V tensors that the blocks index.

A slot's context lives in the blocks listed in its block table, in order; memory follows real
use instead of reserving max_len per slot. When a decode step needs a new block and none is
free, ``reserve_step`` evicts the scheduling policy's victim (its blocks go back to the pool) and
tells the engine, which requeues it for recompute.

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
from collections.abc import Callable
from itertools import compress


def prefix_key(parent: bytes | None, tokens: tuple[int, ...]) -> bytes:
    """A full block's key: SHA-256 of its parent's key and its token ids, so a key names the
    whole prefix up to the block's end. A cryptographic hash, as vLLM moved to after a collision
    advisory (GHSA-rm76-4mrf-v9r8): with Python's 64-bit ``hash`` two different prefixes could
    share a key, and comparing a block's own tokens would not catch a different parent."""
    h = hashlib.sha256(parent or b"")
    h.update(array("q", tokens).tobytes())
    return h.digest()


def check_pool_holds_one_request(n_blocks: int, block_size: int, max_len: int) -> None:
    """ValueError unless a pool of ``n_blocks`` blocks holds one request of ``max_len`` tokens.
    A server or app whose paged pool could not would refuse most requests at once, so both refuse
    it at startup: the rule a KV budget already follows (``kv_memory_mib``, engine/build.py) and
    vLLM's (a KV cache below max_model_len), applied to an explicit kv_blocks (the engine itself
    allows small pools: tests use them)."""
    need = -(-max_len // block_size)
    if n_blocks < need:
        tokens = n_blocks * block_size
        raise ValueError(
            f"kv_blocks {n_blocks} is too small for one request: the pool holds {n_blocks} "
            f"block{'s' * (n_blocks != 1)} of {block_size} tokens ({tokens} tokens), one request of "
            f"max_len {max_len} needs {need} (raise kv_blocks to {need} or lower max_len to {tokens})"
        )


class BlockPool:
    """``n_blocks`` blocks of ``block_size`` tokens shared by ``n_slots`` slots. ``lens[s]``: the
    tokens slot ``s`` holds (for the token-budget scheduler: tokens computed so far).

    A sequence starts with ``activate`` and gains new blocks only through ``try_grow``, whichever
    scheduler runs it: ``occupy`` (the prefill-then-decode scheduler's admission), ``reserve_step``
    (its decode step's next block) and ``fork`` are made of those two (blocks shared with another
    sequence come through ``take_prefix`` and ``fork``)."""

    def __init__(self, n_slots: int, n_blocks: int, block_size: int, max_len: int):
        if n_blocks < 1 or block_size < 1 or n_slots < 1 or max_len < 1:
            raise ValueError(
                f"PagedKVCache needs n_blocks, block_size, n_slots and max_len >= 1, got {n_blocks}, "
                f"{block_size}, {n_slots}, {max_len}"
            )
        self.n_slots, self.max_len = n_slots, max_len
        self.n_blocks, self.block_size = n_blocks, block_size
        self.max_blocks = math.ceil(max_len / block_size)
        self.tables: list[list[int]] = [[] for _ in range(n_slots)]
        # The same tables as one flat row of ``table_width`` block ids per slot, past a table's end
        # ``n_blocks`` (no block: the paged cache's scratch block), kept in step by ``_append`` and
        # ``release``: the C kernels read a step's tables here in place (``PagedKVCache.table_rows``)
        # instead of the step copying them out of the lists. (Wider than max_blocks by one where
        # max_len is a whole number of blocks: ``occupy`` holds room for the position after a context.)
        self.table_width = self.blocks_for(max_len + 1)
        self.table_array = array("q", [n_blocks]) * (n_slots * self.table_width)
        self.ref = [0] * n_blocks  # block → how many slots' tables hold it
        self._free: list[int] = list(range(n_blocks))  # a heap: lowest id first (easy to read)
        self.prefix_cache = False  # set by the engine (chunked prefill only)
        self.reserve_whole = False  # the slot cache's rule: a slot admitted takes blocks for max_len at once
        self.block_key: list[bytes | None] = [None] * n_blocks  # a full block's prefix key, if cached
        self.block_tokens: list[tuple[int, ...] | None] = [None] * n_blocks
        self.cached: dict[bytes, int] = {}  # prefix key → block
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached blocks at zero refs, oldest first
        self.slot_keys: list[list[bytes]] = [[] for _ in range(n_slots)]  # keys of each slot's full blocks
        self.lens = [0] * n_slots
        self.active = [False] * n_slots
        self._order = [0] * n_slots  # admission order, for "newest"
        self._admissions = 0
        self._dirty = True  # changed since the tensors last synced

    # -- slots ----------------------------------------------------------------------------
    def free_slots(self) -> list[int]:
        return [s for s in range(self.n_slots) if not self.active[s]]

    def blocks_for(self, n_tokens: int) -> int:
        return math.ceil(n_tokens / self.block_size)

    def check_fits(self, total_tokens: int) -> None:
        """Refuse a request that could not fit the whole pool even alone."""
        need = self.blocks_for(total_tokens)
        if need > self.n_blocks:
            n = self.n_blocks
            raise ValueError(
                f"{total_tokens} tokens need {need} blocks of {self.block_size}, "
                f"but the pool has only {n} block{'s' * (n != 1)} ({n * self.block_size} tokens)"
            )

    def can_admit(self, context_lens: list[int]) -> bool:
        """Enough free blocks for every context plus the position its first decode writes (with
        ``reserve_whole``: for max_len each)."""
        return sum(self.blocks_for(self._admission_tokens(n)) for n in context_lens) <= self.num_free_blocks()

    def _admission_tokens(self, n_tokens: int) -> int:
        return self.max_len if self.reserve_whole else n_tokens + 1

    def occupy(self, slot: int, n_tokens: int) -> None:
        """A free slot takes a context of ``n_tokens`` (computed by the pass that follows), with
        room for the position its first decode writes (with ``reserve_whole``: for max_len).
        The caller asked ``can_admit`` first."""
        self.activate(slot)
        if not self.try_grow(slot, self._admission_tokens(n_tokens)):
            self.release(slot)
            raise RuntimeError(f"slot {slot}: {n_tokens} tokens do not fit the free blocks (ask can_admit first)")
        self.lens[slot] = n_tokens

    # -- a sequence's blocks, for every scheduler (the token budget's lens: tokens computed so far)
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
        have = len(self.tables[slot])
        if n_tokens <= have * self.block_size:  # (most calls: a decode inside its last block)
            return True
        need = self.blocks_for(n_tokens) - have
        if need > self.num_free_blocks():
            return False
        if need > 0:
            self._grow(slot, have + need)
        return True

    def trim(self, slot: int, n_tokens: int) -> None:
        """The slot keeps its first ``n_tokens`` positions: a speculative draft rejected. Blocks
        past them (fresh ones a draft spilled into: never shared, never cached) are freed."""
        keep = self.blocks_for(n_tokens)
        table = self.tables[slot]
        while len(table) > keep:
            b = table.pop()
            self.table_array[slot * self.table_width + len(table)] = self.n_blocks
            self.ref[b] -= 1
            if self.ref[b] == 0:
                heapq.heappush(self._free, b)
        self.lens[slot] = n_tokens
        self._dirty = True

    def room(self, slot: int) -> int:
        """Tokens the slot can still add: the rest of its blocks plus every free block."""
        return len(self.tables[slot]) * self.block_size - self.lens[slot] + self.num_free_blocks() * self.block_size

    def room_fresh(self) -> int:
        """Tokens a newly admitted sequence could take: every free block."""
        return self.num_free_blocks() * self.block_size

    def fork(self, src: int, dst: int) -> tuple[int, int] | None:
        """Free slot ``dst`` starts as a fork of ``src`` (n samples of one prompt): it shares
        src's full blocks (reference count + 1, nothing copied: nobody writes a full block) and
        gets a new block for src's partial last block, since both will write their own next
        tokens there (copy-on-write, done at once). Returns (src block, dst block) whose K/V the
        caller copies, or None when src's context ends on a block boundary. Needs one free
        block (the caller checks ``num_free_blocks()``)."""
        assert self.active[src] and not self.active[dst] and not self.tables[dst], f"cannot fork {src} to {dst}"
        full, partial = divmod(self.lens[src], self.block_size)
        self.activate(dst)
        for b in self.tables[src][:full]:
            self.ref[b] += 1
            self._append(dst, b)
        self.slot_keys[dst] = list(self.slot_keys[src][:full])
        self.lens[dst] = self.lens[src]
        if not partial:
            return None
        if not self.try_grow(dst, self.lens[dst]):  # its own copy of src's partial block
            self.release(dst)
            raise RuntimeError(f"no free block to fork slot {src} into {dst} (check num_free_blocks first)")
        return self.tables[src][full], self.tables[dst][full]

    # -- prefix caching ---------------------------------------------------------------------
    def match_prefix(self, tokens: list[int]) -> list[int]:
        """Blocks of the longest cached chain of full blocks that starts ``tokens``, never
        covering all of it (at most (len - 1) // block_size blocks)."""
        if not self.prefix_cache:
            return []
        bs, out, parent = self.block_size, [], None
        for i in range((len(tokens) - 1) // bs):
            toks = tuple(tokens[i * bs : (i + 1) * bs])
            b = self.cached.get(prefix_key(parent, toks))
            if b is None or self.block_tokens[b] != toks:  # a miss, or a collision: stop here
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
                del self._lru[b]  # revived: keeps its key
            self.ref[b] += 1
            self._append(slot, b)
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
            toks = tuple(tokens[i * bs : (i + 1) * bs])
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
                    self._lru[b] = None  # stays cached until the pool needs it
                else:
                    heapq.heappush(self._free, b)
        self.tables[slot] = []
        w = self.table_width
        self.table_array[slot * w : (slot + 1) * w] = array("q", [self.n_blocks]) * w
        self.slot_keys[slot] = []
        self.active[slot] = False
        self.lens[slot] = 0
        self._dirty = True

    def reserve_step(self, victim: Callable[[list[int]], int] | None = None) -> list[int]:
        """Make sure every active slot has room for the token this step writes. While blocks are
        short, evicts ``victim(active slots, in admission order)`` (the scheduling policy's
        choice; default the newest); returns the evicted slots (already released)."""
        evicted: list[int] = []
        while True:
            needy = [
                s
                for s in range(self.n_slots)
                if self.active[s] and self.lens[s] >= len(self.tables[s]) * self.block_size
            ]
            if len(needy) <= self.num_free_blocks():
                break
            active = sorted((s for s in range(self.n_slots) if self.active[s]), key=lambda s: self._order[s])
            out = victim(active) if victim is not None else active[-1]
            self.release(out)
            evicted.append(out)
        for s in needy:
            if not self.try_grow(s, self.lens[s] + 1):  # (a block each: counted free above)
                raise RuntimeError(f"slot {s}: no free block for its next token after the evictions")
        return evicted

    def used_tokens(self) -> int:
        """Context tokens stored, each once: a shared (prefix-cached, always full) block held by
        r sequences is in each one's length but in memory once."""
        held = len(self.ref) - self.ref.count(0)  # blocks referenced at all (each once in memory)
        shared = (sum(self.ref) - held) * self.block_size  # the references past each one's first
        return sum(compress(self.lens, self.active)) - shared

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

    # -- internals ------------------------------------------------------------------------
    def _grow(self, slot: int, n_blocks: int) -> None:
        while len(self.tables[slot]) < n_blocks:
            if self._free:
                b = heapq.heappop(self._free)
            else:  # evict the least recently freed cached block
                b, _ = self._lru.popitem(last=False)
                del self.cached[self.block_key[b]]
                self.block_key[b] = self.block_tokens[b] = None
            self.ref[b] = 1
            self._append(slot, b)
        self._dirty = True

    def _append(self, slot: int, b: int) -> None:
        """Block ``b`` joins the end of the slot's table (the list and its row in ``table_array``)."""
        table = self.tables[slot]
        if len(table) >= self.table_width:  # (never: a context fits max_len; the row's edge)
            raise RuntimeError(f"slot {slot}'s block table would outgrow max_len ({self.max_len} tokens)")
        self.table_array[slot * self.table_width + len(table)] = b
        table.append(b)
