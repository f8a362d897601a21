"""A prompt's own log-probabilities: how likely the model finds each prompt token given the ones
before it (vLLM's ``prompt_logprobs``; what an evaluation harness asks the completions route for
with ``echo`` and ``max_tokens: 0`` to score a continuation).

One causal forward over the whole prompt, without a KV cache: the model's plain scoring pass
(``Transformer.forward`` without a cache), so the figures are the model's, not a scheduler's. The
first token has no logprob (nothing comes before it): None, as vLLM and OpenAI give.
"""

from __future__ import annotations

import torch

from tinyllm.model.device import autocast
from tinyllm.model.transformer import Transformer
from tinyllm.request import TokenLogprob

SCORE_CHUNK = 512  # positions whose log-softmax is held at once (a long prompt x a large vocabulary)


@torch.no_grad()
def prompt_logprobs(model: Transformer, prompt: list[int] | tuple[int, ...], top: int = 0) -> list[TokenLogprob | None]:
    """One entry per prompt token: None for the first, then the token's logprob given the tokens
    before it, its rank, and the ``top`` most likely tokens at that position with theirs."""
    ids = list(prompt)
    if not ids:
        return []
    if len(ids) > model.cfg.max_seq_len:
        raise ValueError(f"prompt of {len(ids)} tokens is longer than the model's max_seq_len {model.cfg.max_seq_len}")
    device = next(model.parameters()).device
    model.eval()
    with autocast(device):
        logits, _ = model(torch.tensor([ids], device=device))
    out: list[TokenLogprob | None] = [None]
    k = min(top, logits.size(-1))
    for start in range(0, len(ids) - 1, SCORE_CHUNK):  # logits at position i predict token i + 1
        lp = torch.log_softmax(logits[0, start : start + SCORE_CHUNK][: len(ids) - 1 - start].float(), dim=-1)
        nxt = torch.tensor(ids[start + 1 : start + 1 + lp.size(0)], device=lp.device).unsqueeze(1)
        chosen = lp.gather(1, nxt)
        ranks = (lp > chosen).sum(1).add(1).tolist()
        top_v, top_i = torch.topk(lp, k, dim=-1) if k else (lp[:, :0], lp[:, :0].long())
        for j, (v, r) in enumerate(zip(chosen.squeeze(1).tolist(), ranks)):
            out.append(TokenLogprob(int(nxt[j]), v, tuple(zip(top_i[j].tolist(), top_v[j].tolist())), r))
    return out
