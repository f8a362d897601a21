"""Sampling, in one place: ``sample_next`` picks the next token of rows that share a setting (solo
generation uses it too); ``sample_rows`` samples a batch whose rows carry different settings,
failing rows one by one.

One ``sample_next`` call per distinct setting (rows with equal settings are sampled together).
``sample_next`` is total over every setting ``Sampling`` accepts; the per-group guard is for the
unforeseen (say NaN logits from one row), so it fails only that group's rows, not the batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tinyllm.request import Sampling, is_greedy


_F32_MAX = torch.finfo(torch.float32).max


def sample_next(logits: Tensor, temperature: float = 0.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """Next token per row: logits (B, V) → (B, 1).

    Total over every setting ``Sampling`` accepts. A temperature below ``GREEDY_BELOW`` is greedy
    (argmax, no randomness used): logits / T would overflow float32. Otherwise logits are divided
    by the temperature (at most float32's largest, so a masked -inf stays -inf), cut to the
    ``top_k`` most likely tokens and to the smallest set whose probability reaches ``top_p``,
    then sampled. The most likely token always survives both cuts, so even a top_p that float32
    rounds to 0 keeps one token."""
    if is_greedy(temperature):
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / min(temperature, _F32_MAX)
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs          # mass of strictly more likely tokens
        drop_sorted = before >= top_p
        drop_sorted[:, 0] = False                              # the most likely token always stays
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)


def sample_rows(logits: Tensor, rows: list[Sampling], generator=None) -> tuple[Tensor, dict[int, str]]:
    """Next token per row (B, V) → (B, 1), and the rows whose sampling failed (row → why; their
    token is 0 and must not be used). Groups are sampled in order of first appearance, so a
    seeded generator gives the same draws for the same batch."""
    groups: dict[Sampling, list[int]] = {}
    for i, s in enumerate(rows):
        groups.setdefault(s, []).append(i)
    if len(groups) == 1:
        (s,) = groups
        try:
            return sample_next(logits, s.temperature, s.top_k, s.top_p, generator), {}
        except Exception as e:                            # noqa: BLE001 - every row shares the setting
            return _zeros(logits), _why(range(len(rows)), e)
    out, failed = _zeros(logits), {}
    for s, idx in groups.items():
        ix = torch.tensor(idx, device=logits.device)
        try:
            out[ix] = sample_next(logits[ix], s.temperature, s.top_k, s.top_p, generator)
        except Exception as e:                            # noqa: BLE001 - only this group's rows fail
            failed.update(_why(idx, e))
    return out, failed


def _zeros(logits: Tensor) -> Tensor:
    return torch.zeros(logits.size(0), 1, dtype=torch.long, device=logits.device)


def _why(rows, e: Exception) -> dict[int, str]:
    return {i: f"sampling failed: {type(e).__name__}: {e}" for i in rows}
