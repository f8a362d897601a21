"""Speculative decoding: a running request's next few tokens guessed cheaply, verified in the
step's one mixed forward. Two proposers, vLLM's methods of the same names:

``ngram`` (prompt lookup, no extra model): the proposer looks for the context's last ``n``
tokens (``prompt_lookup_max`` down to ``prompt_lookup_min``) earlier in the context and, at its
latest earlier match, proposes the tokens that followed it, up to ``num_speculative_tokens``: text that repeats or continues what is
in the prompt (code edits, quotes, summaries) gets drafts, other text gets none.

``draft_model`` (engine/draft_model.py): a small model with the same tokenizer (the bundled one has
``tinyllm/data/shakespeare-draft``, distilled from the bundled model by ``tinyllm train
--draft-for``) guesses every request's next ``k`` tokens greedily, all requests in one batch.
It keeps no KV cache across steps: each step it re-reads the request's last ``DRAFT_WINDOW``
tokens, so nothing of it has to follow the target's rollbacks, preemptions and prefix hits,
and a guess from a window is still a guess: verification keeps the output exact. Its passes
are the engine's ragged forward (the C kernels on a CPU): a PyTorch-eager draft pass costs more
than the bundled model's whole decode step on a CPU (framework overhead, not arithmetic).

The token-budget scheduler gives a request with a draft one item of ``1 + k`` tokens (its newest
token, then the draft: counted in the budget, as vLLM V1 does); the forward returns logits at
every one of them; the commit accepts the draft's longest prefix the model agrees with and the
model's own token after it (the bonus), so ``1..k+1`` tokens land per step. The K/V written for
rejected draft tokens is rolled back (the slot's length set back, blocks a draft spilled into
freed) and prefix-cache keys cover committed tokens only. Drafted are greedy requests with no
penalty, ban or logprobs (the model's token is its logits' argmax at each position, so output is
identical, token for token, to decoding without speculation) and unseeded sampled ones (verified
by rejection sampling against their own distribution, engine/commit.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tinyllm.config import EngineConfig


class Proposer(Protocol):
    """Drafts for this step's decodes: ``asks`` is each request's (context, room), room the most
    tokens its draft may have; the answer, in order, a draft of at most that many tokens each."""

    method: str  # vLLM's speculative_config method: "ngram" or "draft_model"

    def propose(self, asks: Sequence[tuple[Sequence[int], int]]) -> list[list[int]]: ...


class NgramProposer:
    """Prompt lookup (``propose_ngram``) for each request on its own."""

    method = "ngram"

    def __init__(self, n_min: int = EngineConfig.prompt_lookup_min, n_max: int = EngineConfig.prompt_lookup_max):
        self.n_min, self.n_max = n_min, n_max

    def propose(self, asks: Sequence[tuple[Sequence[int], int]]) -> list[list[int]]:
        return [propose_ngram(ctx, room, self.n_min, self.n_max) if room > 0 else [] for ctx, room in asks]


def propose_ngram(
    context: list[int] | tuple[int, ...],
    k: int,
    n_min: int = EngineConfig.prompt_lookup_min,
    n_max: int = EngineConfig.prompt_lookup_max,
) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the context's last n
    tokens (the longest n from ``n_max`` down to ``n_min`` that occurs); [] if none does."""
    if k <= 0:
        return []
    L = len(context)
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        tail = tuple(context[L - n :])
        for start in range(L - n - 1, -1, -1):  # the latest match first (before the tail itself)
            if tuple(context[start : start + n]) == tail:
                return list(context[start + n : start + n + k])
    return []


def count_verified(stats, k: int, accepted: int) -> None:
    """A verified draft of ``k`` tokens, ``accepted`` of them kept, in ``stats`` (the engine's
    Stats: vLLM's spec_decode counters, and accepted tokens per draft position)."""
    stats.spec_drafts += 1
    stats.spec_draft_tokens += k
    stats.spec_accepted_tokens += accepted
    per_pos = stats.spec_accepted_per_pos
    if len(per_pos) < k:
        per_pos += [0] * (k - len(per_pos))
    for i in range(accepted):
        per_pos[i] += 1
