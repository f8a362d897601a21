"""A vLLM server's prefix cache, rebuilt from the KV-cache events it publishes.

vLLM started with ``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'``
sends, per engine step, a batch of what its prefix cache did: ``BlockStored`` (the hashes of newly
cached full blocks, their parent block's hash, their token ids), ``BlockRemoved`` (evicted hashes),
``AllBlocksCleared`` (a prefix-cache reset). Routers consume the stream to route by prefix; here it
becomes a picture: a forest of hash chains (a block's parent is the block before it in some prompt),
where a block with two or more children is a prefix that several sequences share. vLLM reports
every physical copy: a block stored again under a hash already cached is the same tokens computed
twice (two requests that could not share, e.g. they ran at once), and each copy's eviction is its
own ``BlockRemoved``; so a hash stays on the map until its last copy goes. (A request with
``kv_cache_report_mode="full"`` also re-reports its prefix-cache hits as stores; those count as
copies here too.)

The wire format is vLLM's own msgspec Structs (``vllm/distributed/kv_events.py``, 0.32.0), mirrored
here so that vLLM itself is never imported; fields a newer vLLM adds are ignored, fields an older one
lacks take defaults. msgspec is optional (the ``vllm-events`` extra), so this module is imported only
when --kv-events is given.

``CacheBook`` (mutable, owned by one thread) applies batches; ``CacheView`` (frozen, plain data) is
what the UI draws. No torch, no textual.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

EVICTED_MARK_S = 3.0  # an evicted block stays on the map as a mark this long
HEAD_TOKENS = 8  # a chain's first token ids, kept to label it

BlockHash = bytes | int  # vLLM's ExternalBlockHash
Key = tuple  # (medium, KV cache group, block hash): each medium and group is its own forest


# -- vLLM's wire format (decode only) --------------------------------------------------------------
class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the tagged union: each event is a msgpack map with ``"type": <class name>``."""


class BlockStored(KVCacheEvent):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None = None
    token_ids: list[int] = []
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    group_idx: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[BlockHash]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A batch is a msgpack array ``[ts, events, data_parallel_rank]`` (vLLM's ``array_like``)."""

    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def decode(payload: bytes) -> KVEventBatch:
    """One published batch; ValueError (msgspec's DecodeError / ValidationError) if it is not one."""
    return _decoder.decode(payload)


# -- what the UI draws ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ChainView:
    """One tree of the forest, depth first. ``cells``: one letter per block: ``b`` a cached full
    block, ``p`` a partial one (fewer tokens than a block), ``s`` a shared prefix (a fork: two or
    more continuations follow it), ``d`` a duplicate (cached in two or more copies), ``o`` a block
    on another medium (e.g. CPU offload), ``x`` a recently evicted block (a short-lived mark); and
    ``,`` (not a block) where a second or later branch of a fork begins."""

    index: int  # the root's arrival number: a stable colour
    cells: str
    partial: bool  # its first block's parent is not cached (evicted, or before we joined)
    head_tokens: tuple[int, ...]  # the first tokens of its first block


@dataclass(frozen=True)
class CacheView:
    endpoint: str
    status: str = "connecting"  # connecting / connected (no batch yet) / receiving / idle / disconnected
    chains: tuple[ChainView, ...] = ()
    blocks: int = 0  # cached now
    tokens: int = 0  # the tokens they hold
    forks: int = 0  # blocks two or more continuations follow
    duplicates: int = 0  # hashes cached in two or more copies (computed twice)
    block_size: int | None = None
    stored: int = 0  # events' blocks (new and re-reported), since we subscribed
    removed: int = 0
    cleared: int = 0
    batches: int = 0
    bad: int = 0  # messages that were not a batch (counted, skipped)
    last_error: str = ""
    missed: int = 0  # batches lost in a sequence gap
    restarts: int = 0  # the publisher's sequence began again (a restarted server)
    unknown_removed: int = 0  # removed hashes we never saw stored (cached before we subscribed)
    last_event_age_s: float | None = None


@dataclass(frozen=True)
class _Block:
    parent: Key | None
    seq: int  # arrival number
    tokens: int
    head: tuple[int, ...]


@dataclass
class CacheBook:
    """The forest, kept by the subscriber thread. ``apply`` takes one decoded batch."""

    endpoint: str
    clock: Callable[[], float] = time.monotonic
    blocks: dict[Key, _Block] = field(default_factory=dict)
    copies: dict[Key, int] = field(default_factory=dict)  # hashes stored more than once: their count
    evicted: deque = field(default_factory=deque)  # (time, root seq, root partial)
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("stored", "removed", "cleared", "batches", "bad", "missed", "restarts", "unknown_removed"), 0
        )
    )
    block_size: int | None = None
    last_error: str = ""
    last_seq: int | None = None
    last_event_t: float | None = None
    _arrivals: int = 0

    def sequence(self, seq: int) -> None:
        """The publisher's batch number: count a gap as missed batches; a number that goes back
        means a new publisher (a restarted server), whose cache starts empty."""
        if self.last_seq is not None:
            if seq <= self.last_seq:
                self.counts["restarts"] += 1
                self.clear()
            elif seq > self.last_seq + 1:
                self.counts["missed"] += seq - self.last_seq - 1
        self.last_seq = seq

    def bad(self, why: str) -> None:
        self.counts["bad"] += 1
        self.last_error = why[:200]

    def apply(self, batch: KVEventBatch) -> None:
        self.counts["batches"] += 1
        self.last_event_t = self.clock()
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                self._stored(ev)
            elif isinstance(ev, BlockRemoved):
                self._removed(ev)
            else:
                self.counts["cleared"] += 1
                self.clear()

    def clear(self) -> None:
        self.blocks.clear()
        self.copies.clear()
        self.evicted.clear()

    def _stored(self, ev: BlockStored) -> None:
        size = ev.block_size or self.block_size or 0  # this event's tokens per block
        self.block_size = max(self.block_size or 0, ev.block_size) or None  # a partial block's is less
        where = (ev.medium or "GPU", ev.group_idx or 0)
        parent = None if ev.parent_block_hash is None else (*where, ev.parent_block_hash)
        for i, h in enumerate(ev.block_hashes):
            key = (*where, h)
            if key in self.blocks:
                self.copies[key] = self.copies.get(key, 1) + 1
            else:
                ids = ev.token_ids[i * size : (i + 1) * size] if size else []
                self.blocks[key] = _Block(parent, self._arrivals, len(ids), tuple(ids[:HEAD_TOKENS]))
                self._arrivals += 1
            self.counts["stored"] += 1
            parent = key

    def _root(self, h: Key) -> tuple[int, bool]:
        """(arrival number, partial) of the first block of ``h``'s chain."""
        b = self.blocks[h]
        seen = 0
        while b.parent is not None and b.parent in self.blocks and seen < 100_000:
            b, seen = self.blocks[b.parent], seen + 1
        return b.seq, b.parent is not None

    def _removed(self, ev: BlockRemoved) -> None:
        now = self.clock()
        where = (ev.medium or "GPU", ev.group_idx or 0)
        for h in ((*where, b) for b in ev.block_hashes):
            self.counts["removed"] += 1
            if h not in self.blocks:
                self.counts["unknown_removed"] += 1
                continue
            if self.copies.get(h, 1) > 1:  # another copy still holds it
                self.copies[h] -= 1
                if self.copies[h] == 1:
                    del self.copies[h]
                continue
            root, partial = self._root(h)
            self.evicted.append((now, root, partial))
            del self.blocks[h]

    def view(self, status: str) -> CacheView:
        """The forest as chains (roots in arrival order, each depth first), with recent evictions
        as marks at the end of the chain they left. O(blocks)."""
        now = self.clock()
        while self.evicted and now - self.evicted[0][0] > EVICTED_MARK_S:
            self.evicted.popleft()
        kids: dict[Key, list[Key]] = {}
        roots = []
        for h, b in self.blocks.items():  # insertion order = arrival order
            if b.parent is not None and b.parent in self.blocks:
                kids.setdefault(b.parent, []).append(h)
            else:
                roots.append(h)
        marks: dict[int, list[bool]] = {}
        for _, root, partial in self.evicted:
            marks.setdefault(root, []).append(partial)
        chains: list[ChainView] = []
        for r in roots:
            cells = []
            stack = [(r, False)]
            while stack:
                h, branch = stack.pop()
                if branch:
                    cells.append(",")
                b = self.blocks[h]
                n = len(kids.get(h, ()))
                cells.append(
                    "s"
                    if n > 1
                    else "d"
                    if h in self.copies
                    else "o"
                    if h[0] != "GPU"
                    else "p"
                    if self.block_size and b.tokens < self.block_size
                    else "b"
                )
                stack.extend((k, i > 0) for i, k in reversed(list(enumerate(kids.get(h, ())))))
            root = self.blocks[r]
            gone = marks.pop(root.seq, [])
            chains.append(ChainView(root.seq, "".join(cells) + "x" * len(gone), root.parent is not None, root.head))
        for seq, partial in marks.items():  # chains evicted whole
            chains.append(ChainView(seq, "x" * len(partial), partial[0], ()))
        chains.sort(key=lambda c: c.index)
        c = self.counts
        return CacheView(
            self.endpoint,
            status,
            tuple(chains),
            len(self.blocks),
            sum(b.tokens for b in self.blocks.values()),
            sum(1 for k in kids.values() if len(k) > 1),
            len(self.copies),
            self.block_size,
            c["stored"],
            c["removed"],
            c["cleared"],
            c["batches"],
            c["bad"],
            self.last_error,
            c["missed"],
            c["restarts"],
            c["unknown_removed"],
            None if self.last_event_t is None else round(now - self.last_event_t, 1),
        )
