"""Per-row sampling for a batch whose rows carry different settings, failing rows one by one.

One ``sample_next`` call per distinct setting (rows with equal settings are sampled together).
``sample_next`` is total over every setting ``Sampling`` accepts; the per-group guard is for the
unforeseen (say NaN logits from one row), so it fails only that group's rows, not the batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tinyllm.generate import sample_next
from tinyllm.request import Sampling


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
