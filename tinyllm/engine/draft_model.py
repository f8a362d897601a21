"""Speculation's draft-model proposer (vLLM's ``draft_model`` method; engine/speculate.py has the
rest of speculation): a smaller checkpoint with the model's tokenizer guesses each drafting
request's next tokens, greedily, on the engine's own ragged forward."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tinyllm.engine.forward import prefill_contexts, ragged_forward
from tinyllm.kv.paged import PagedKVCache
from tinyllm.model.transformer import Transformer

BLOCK = 16  # the draft's own pool's block size
DRAFT_WINDOW = 32
"""Tokens of context the draft model re-reads per step. (The bundled pair, k = 4, one sequence,
lookup-friendly prompts: 54% of drafts kept from 32 tokens, 58% from the whole context; of 16,
32, 64, 128 and the whole, 32 ran fastest.)"""


class DraftModelProposer:
    """A draft model's greedy guesses, every asking request in one batch, on the same ragged
    forward and kernels as the model's own passes: one pass over the requests' last ``window``
    tokens, then one pass per further token, on a small pool of the draft's own (kept between
    proposals, its slots released before each returns: nothing carries over). Greedy drafts are a deterministic
    proposal, so the verifier's rules (greedy match, or rejection sampling against a point mass)
    keep the model's output exact whatever the draft model says."""

    method = "draft_model"

    def __init__(self, model: Transformer, window: int = DRAFT_WINDOW):
        self.model = model.eval()
        self.window = window
        self.pool: PagedKVCache | None = None  # allocated at the first proposal, grown when one needs more

    def _pool(self, rows: int, tokens: int) -> PagedKVCache:
        """A pool of ``rows`` slots of ``tokens`` each (kept between proposals: one allocation)."""
        pool = self.pool
        if pool is None or pool.n_slots < rows or pool.max_len < tokens + 1:
            cfg, weight = self.model.cfg, next(self.model.parameters())
            per_row = -(-(tokens + 1) // BLOCK)
            pool = PagedKVCache(
                cfg.n_layers, rows, cfg.n_kv_heads, cfg.head_dim, rows * per_row, BLOCK, tokens + 1, weight.dtype,
                weight.device,
            )  # fmt: skip
            self.pool = pool
        return pool

    @torch.no_grad()
    def propose(self, asks: Sequence[tuple[Sequence[int], int]]) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in asks]
        rows = [i for i, (ctx, room) in enumerate(asks) if room > 0 and len(ctx) > 0]
        if not rows:
            return drafts
        k = max(asks[i][1] for i in rows)
        width = min(self.window, self.model.cfg.max_seq_len - k)
        tails = [list(asks[i][0][-width:]) for i in rows]
        pool = self._pool(len(rows), max(len(t) for t in tails) + k)
        slots = list(range(len(rows)))
        try:
            for slot, tail in zip(slots, tails):
                pool.occupy(slot, len(tail))
            guesses = [prefill_contexts(self.model, pool, slots, tails).argmax(-1)]
            for i in range(1, k):  # each row's next guess, one token a row
                for slot, tail in zip(slots, tails):
                    pool.try_grow(slot, len(tail) + i + 1)
                items = [(slot, len(tail) + i - 1, 1) for slot, tail in zip(slots, tails)]
                logits = ragged_forward(self.model, pool, items, guesses[-1].tolist(), list(slots))
                guesses.append(logits.argmax(-1))
        finally:
            for slot in slots:
                pool.release(slot)
        table = torch.stack(guesses, 1).tolist()
        for row, i in enumerate(rows):
            drafts[i] = table[row][: asks[i][1]]
        return drafts
