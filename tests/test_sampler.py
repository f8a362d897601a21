"""The sampler is total: every setting ``Sampling`` accepts yields a valid token id, never an
error, and the settings that leave one candidate (greedy, top_k 1, a tiny top_p) give the argmax."""

from __future__ import annotations

import itertools
import sys

import pytest
import torch

from tinyllm.engine.sampler import sample_rows
from tinyllm.engine.sampler import sample_next
from tinyllm.request import GREEDY_BELOW, Sampling, is_greedy

V = 50
F32_MAX = torch.finfo(torch.float32).max
TEMPERATURES = [0, 0.0, 5e-324, 1e-39, 1e-6, GREEDY_BELOW, 0.7, 1, 1e30, F32_MAX, 1e300, sys.float_info.max, 10**300]
TOP_KS = [None, 1, 2, V, V + 1, 10**100]
TOP_PS = [None, 5e-324, 1e-46, 1e-6, 0.5, 1.0, 1]


def _logits(rows: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, V) logits with one clear winner per row and a masked token (-inf, as a vocab pad
    would be), and the winners."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, V, generator=g)
    best = torch.randint(1, V, (rows,), generator=g)
    logits[torch.arange(rows), best] = logits.max() + 2.0
    logits[:, 0] = float("-inf")
    return logits, best


def _one_candidate(t: float, k: int | None, p: float | None) -> bool:
    """Settings under which only the most likely token may be drawn."""
    return is_greedy(t) or k == 1 or (p is not None and p <= 1e-6)


@pytest.mark.parametrize("t", TEMPERATURES, ids=lambda t: f"{type(t).__name__}-{float(t):g}")
def test_every_accepted_setting_gives_a_valid_token_and_the_argmax_where_it_must(t):
    logits, best = _logits()
    g = torch.Generator().manual_seed(1)
    for k, p in itertools.product(TOP_KS, TOP_PS):
        Sampling(t, k, p)                                           # validation accepts it ...
        tok = sample_next(logits, t, k, p, g)                       # ... so the sampler must serve it
        assert tok.shape == (3, 1) and tok.dtype == torch.long, (t, k, p)
        assert ((tok >= 1) & (tok < V)).all(), (t, k, p, tok)       # never the masked token 0
        if _one_candidate(t, k, p):
            assert torch.equal(tok[:, 0], best), (t, k, p, tok)


def test_greedy_below_1e_minus_5_as_vllm():
    assert is_greedy(0) and is_greedy(1e-39) and is_greedy(9.9e-6) and not is_greedy(1e-5)
    flat = torch.zeros(1, V)                                        # every token equally likely
    g = torch.Generator().manual_seed(0)
    assert {int(sample_next(flat, 1e-5, generator=g)) for _ in range(40)} != {0}   # 1e-5 still samples
    assert {int(sample_next(flat, 9e-6, generator=g)) for _ in range(40)} == {0}   # argmax: the first
    assert Sampling(1e-39).describe() == "greedy" and Sampling(1e-5).describe() == "T=1e-05"


def test_a_batch_with_mixed_extreme_settings_fails_no_row():
    rows = [Sampling(0), Sampling(1e-39), Sampling(1.0, top_p=1e-46), Sampling(1e300, top_k=V + 5),
            Sampling(0.7, top_k=1), Sampling(1e-6, top_p=0.5), Sampling(F32_MAX, 3, 1e-46), Sampling(2.0, V, 1.0)]
    logits, best = _logits(len(rows))
    tok, failed = sample_rows(logits, rows, torch.Generator().manual_seed(0))
    assert failed == {} and tok.shape == (len(rows), 1)
    assert ((tok >= 1) & (tok < V)).all()
    for i, s in enumerate(rows):
        if _one_candidate(s.temperature, s.top_k, s.top_p):
            assert int(tok[i]) == int(best[i]), (i, s)


def test_sampling_refuses_an_int_temperature_too_large_for_a_float():
    with pytest.raises(ValueError, match="temperature must be a finite number"):
        Sampling(10**400)
