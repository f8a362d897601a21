"""n samples of one prompt (OpenAI's ``n``): queued as forks that share the parent's prompt.

A part of ContinuousEngine (a mixin: it reads and changes the engine's own state), kept
apart so the engine's step reads on its own. See ``ContinuousEngine.add_forks``.
"""

from __future__ import annotations

from dataclasses import replace

from tinyllm.engine.sequence import Sequence
from tinyllm.observe.snapshot import FORK_OF
from tinyllm.request import MAX_N, Request, fork_sampling, is_int


class ForkSamples:
    """ContinuousEngine.add_forks and the forks it makes."""

    def add_forks(self, req: Request, n: int) -> list[int]:
        """Queue ``n`` samples of one prompt (OpenAI's ``n``); returns their ids, the parent's
        first. Sample i's settings are ``fork_sampling(sampling, i)`` (a seeded request: seed + i),
        so each equals its seeded solo run. With the token-budget scheduler the prompt is
        computed once: only the parent is queued; the others wait for its prompt (``forks``) and
        fork off it when it samples its first token (``_fork``: its full blocks shared, its
        partial last block copied). With the seed's scheduler they are n independent requests.
        If the parent ends before its fork, the first of its waiting samples takes its place
        (``_unfork``)."""
        if not is_int(n) or not 1 <= n <= MAX_N:
            raise ValueError(f"n must be an integer from 1 to {MAX_N}, got {n!r}")
        if not isinstance(req, Request):
            raise ValueError(f"add_forks needs a Request, got {type(req).__name__}")
        sampling = req.sampling or self.sampling
        reqs = [replace(req, sampling=fork_sampling(sampling, i)) for i in range(n)]
        if not self.chunked_prefill:
            return [self.add_request(r) for r in reqs]
        parent = self._new_seq(reqs[0])
        children = [self._new_seq(r) for r in reqs[1:]]  # all checked before anything is queued
        self.waiting.add(parent)
        self._note("queued", parent, tokens=len(parent.req.prompt))
        for child in children:
            child.fork_of = parent.rid
            parent.forks.append(child)
            self._note("queued", child, tokens=len(child.req.prompt), reason=f"{FORK_OF}{parent.rid}")
        return [parent.rid] + [c.rid for c in children]

    def _fork(self, parent: Sequence) -> list[Sequence]:
        """``parent`` computed its prompt and samples its first token now: each sample waiting
        for it takes a free slot, shares its full blocks and gets a copy of its partial last
        block (``PagedKVCache.fork``), and samples its own first token from the parent's logits
        row (returned: those seated). A sample that finds no free slot, or no free block for
        its first token, goes to the front of the queue as an ordinary request instead (the
        prefix cache may still serve its prompt): nothing waits on a fork that cannot happen."""
        children, parent.forks = parent.forks, []
        seated, left = [], []
        for child in children:
            free = self.slots.free_slots()
            if not free or self.slots.num_free_blocks() < 1:
                left.append(child)
                continue
            self.slots.fork(parent.slot, free[0])
            child.computed, child.cached_tokens, child.admit_cached = (
                parent.computed,
                parent.cached_tokens,
                parent.admit_cached,
            )
            self._seat(child, free[0], parent.computed, f"{FORK_OF}{parent.rid}")
            self._forked.add(child.rid)
            seated.append(child)
        for child in reversed(left):
            self.waiting.prepend(child)
        return seated

    def _pending_forks(self) -> list[Sequence]:
        """Samples waiting for their parent's prompt (in no queue: their parent is)."""
        return [c for q in [*self._running, *self.waiting] for c in q.forks]

    def _unfork(self, seq: Sequence) -> None:
        """``seq`` ends. A sample waiting for its parent's prompt leaves the parent's list. A
        parent whose samples still wait for its prompt hands them to the first of them, which
        takes its place at the front of the queue: the prompt is still computed once."""
        parent = self._seqs.get(seq.fork_of) if seq.fork_of is not None else None
        if parent is not None and seq in parent.forks:
            parent.forks.remove(seq)
        if seq.forks:
            heir, *rest = seq.forks
            seq.forks, heir.forks = [], rest
            for child in rest:
                child.fork_of = heir.rid
            self.waiting.prepend(heir)
