"""The sampler is total: every setting ``Sampling`` accepts yields a valid token id, never an
error, and the settings that leave one candidate (greedy, top_k 1, a tiny top_p) give the argmax."""

from __future__ import annotations

import itertools
import sys

import pytest
import torch

from tinyllm.engine.sampler import sample_next, sample_rows
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
        Sampling(t, k, p)  # validation accepts it ...
        tok = sample_next(logits, t, k, p, g)  # ... so the sampler must serve it
        assert tok.shape == (3, 1) and tok.dtype == torch.long, (t, k, p)
        assert ((tok >= 1) & (tok < V)).all(), (t, k, p, tok)  # never the masked token 0
        if _one_candidate(t, k, p):
            assert torch.equal(tok[:, 0], best), (t, k, p, tok)


def test_greedy_below_1e_minus_5_as_vllm():
    assert is_greedy(0) and is_greedy(1e-39) and is_greedy(9.9e-6) and not is_greedy(1e-5)
    flat = torch.zeros(1, V)  # every token equally likely
    g = torch.Generator().manual_seed(0)
    assert {int(sample_next(flat, 1e-5, generator=g)) for _ in range(40)} != {0}  # 1e-5 still samples
    assert {int(sample_next(flat, 9e-6, generator=g)) for _ in range(40)} == {0}  # argmax: the first
    assert Sampling(1e-39).describe() == "greedy" and Sampling(1e-5).describe() == "T=1e-05"


def test_a_batch_with_mixed_extreme_settings_fails_no_row():
    rows = [
        Sampling(0),
        Sampling(1e-39),
        Sampling(1.0, top_p=1e-46),
        Sampling(1e300, top_k=V + 5),
        Sampling(0.7, top_k=1),
        Sampling(1e-6, top_p=0.5),
        Sampling(F32_MAX, 3, 1e-46),
        Sampling(2.0, V, 1.0),
    ]
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


# -- the sampling fields of issue 24: min_p, penalties, seed, bans, logprobs ----------------------------
from tinyllm.engine.sampler import Row, _penalize, sample_batch, seeded_uniforms  # noqa: E402

MIN_PS = [0, 5e-324, 1e-6, 0.5, 1]
PENALTIES = [-2, -1e-300, 0, 5e-324, 2]
REPETITIONS = [5e-324, 1e-300, 0.5, 1, 2, 1e300, sys.float_info.max]
SEEDS = [None, 0, -(2**63), 2**63 - 1]


@pytest.mark.parametrize("t", TEMPERATURES, ids=lambda t: f"{type(t).__name__}-{float(t):g}")
def test_every_accepted_new_field_gives_a_valid_token_never_nan(t):
    """Every extreme of min_p, the three penalties and the seed, with every top_k / top_p extreme,
    one batch per temperature (the sampler is vectorised: all rows in one call): a valid token,
    no failed row, never the masked token 0 nor a banned one, the argmax where only it may be drawn."""
    combos = list(itertools.product(MIN_PS, PENALTIES, PENALTIES, REPETITIONS, SEEDS))
    rows, settings = [], []
    for i, (mp, pres, freq, rep, seed) in enumerate(combos):
        s = Sampling(t, TOP_KS[i % len(TOP_KS)], TOP_PS[i % len(TOP_PS)], mp, pres, freq, rep, seed)
        rows.append(
            Row(s, prompt=(1, 2, 3, 0), output=(3, 3, 7)[: i % 4], banned=(5,) if i % 3 else (), logprobs=i % 3 or None)
        )
        settings.append(s)
    logits = _logits(len(rows))[0]
    logits[::5] *= 1e30  # huge logits (finite) too
    out = sample_batch(logits, rows, torch.Generator().manual_seed(2))
    assert out.failed == {} and out.tokens.shape == (len(rows), 1)
    tok = out.tokens[:, 0]
    assert ((tok >= 1) & (tok < V)).all()
    assert all(int(tok[i]) != 5 for i, r in enumerate(rows) if r.banned)
    assert set(out.logprobs) == {i for i, r in enumerate(rows) if r.logprobs is not None}
    for i, lp in out.logprobs.items():
        assert lp.token == int(tok[i]) and len(lp.top) == rows[i].logprobs
        assert all(v == v and v <= 0 for _, v in ((0, lp.logprob), *lp.top))  # never NaN, never > 0
    plain = [
        i
        for i, s in enumerate(settings)
        if not s.penalized and not rows[i].banned and _one_candidate(t, s.top_k, s.top_p)
    ]
    assert plain and all(int(tok[i]) == int(logits[i].argmax()) for i in plain)


def test_penalties_follow_vllm():
    """repetition divides positive logits and multiplies negative ones of prompt or output tokens;
    frequency subtracts per output occurrence; presence once per output token; -inf stays."""
    x = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0, float("-inf")]])
    s = Sampling(1.0, repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    got = _penalize(x.clone(), [Row(s, prompt=(0, 1, 5), output=(2, 2, 3))])
    want = torch.tensor([[1.0, -4.0, 1.0 - 1.0 - 0.25, -4.0 - 0.5 - 0.25, 1.0, float("-inf")]])
    assert torch.equal(got, want), got


def test_min_p_drops_tokens_below_min_p_times_the_top_probability():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    rows = [Row(Sampling(1.0, min_p=0.2, seed=i)) for i in range(400)]
    tok = sample_batch(probs.log().expand(400, 4), rows).tokens[:, 0].tolist()
    assert set(tok) == {0, 1, 2}  # 0.05 < 0.2 x 0.5: never drawn


def test_seeded_draws_depend_on_seed_and_position_only():
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(3))
    s = Sampling(1.0, seed=42)
    solo = sample_batch(logits, [Row(s, output=(1, 2))]).tokens
    others = torch.randn(5, V, generator=torch.Generator().manual_seed(4))
    mixed = [Row(Sampling(0.7)), Row(s, output=(9, 9)), Row(Sampling(1.0, seed=7)), Row(Sampling(0)), Row(s)]
    batch = sample_batch(
        torch.cat([others[:1], logits, others[1:3], logits]), mixed, torch.Generator().manual_seed(0)
    ).tokens
    assert int(batch[1]) == int(solo)  # same seed, same position: same token
    draws = {int(sample_batch(logits, [Row(Sampling(1.0, seed=k), output=(1, 2))]).tokens) for k in range(40)}
    assert len(draws) > 5  # different seeds: different draws
    u = seeded_uniforms(torch.tensor([42, 42, 43]), torch.tensor([2, 3, 2]))
    assert len(set(u.tolist())) == 3 and ((u >= 0) & (u < 1)).all()


def test_seeded_uniforms_are_splitmix64():
    """The counter-based generator equals its pure-Python definition (int64 wrap-around and
    logical shifts done right), so seeded outputs are the same on every machine."""
    m = 2**64

    def mix(z):
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 % m
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB % m
        return z ^ (z >> 31)

    seeds, pos = [0, 1, -1, 2**63 - 1, -(2**63), 12345], [0, 5, 1000, 7, 3, 10**6]
    want = [
        (mix((mix((s + 0x9E3779B97F4A7C15) % m) + p * 0x9E3779B97F4A7C15) % m) >> 11) * 2.0**-53
        for s, p in zip(seeds, pos)
    ]
    assert seeded_uniforms(torch.tensor(seeds), torch.tensor(pos)).tolist() == want


def test_a_ban_is_dropped_only_where_it_would_leave_nothing():
    x = torch.full((2, 4), float("-inf"))
    x[:, 2] = 1.0
    x[1, 3] = 0.5
    out = sample_batch(x, [Row(Sampling(0), banned=(2,)), Row(Sampling(0), banned=(2,))]).tokens[:, 0].tolist()
    assert out == [2, 3]  # row 0: 2 is all there is


def test_logprobs_are_the_models_own_and_only_for_rows_that_ask():
    logits, _ = _logits(2)
    out = sample_batch(logits, [Row(Sampling(0), logprobs=3), Row(Sampling(0.9, top_k=2))])
    assert set(out.logprobs) == {0}
    lp = out.logprobs[0]
    ref = torch.log_softmax(logits[0], -1)
    assert lp.token == int(ref.argmax()) and lp.logprob == pytest.approx(float(ref.max()))
    assert [t for t, _ in lp.top] == ref.topk(3).indices.tolist()
    assert [v for _, v in lp.top] == pytest.approx(ref.topk(3).values.tolist())


def test_sampling_refuses_out_of_range_new_fields_naming_them():
    from tinyllm.request import SamplingError

    for kw, field in [
        ({"min_p": 1.5}, "min_p"),
        ({"min_p": float("nan")}, "min_p"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"seed": 2**63}, "seed"),
        ({"seed": True}, "seed"),
        ({"seed": 1.5}, "seed"),
    ]:
        with pytest.raises(SamplingError) as e:
            Sampling(1.0, **kw)
        assert e.value.field == field


def test_a_sequence_keeps_its_row_while_its_bans_hold_and_the_row_sees_every_new_token():
    """``Sequence.row`` is asked for every running sequence every step, so it is kept: it must
    still see the tokens generated since (penalties read them, a seeded draw counts them) and
    must change when min_tokens is reached (the stop ids are then allowed)."""
    from tinyllm.engine.sequence import Sequence
    from tinyllm.request import Request

    req = Request([1, 2, 3], 10, eos_id=5, stop_token_ids=[6], min_tokens=2).frozen()
    seq = Sequence(0, req, Sampling(0.0, frequency_penalty=0.5), 0.0)
    first = seq.row()
    assert first.banned == (5, 6) and not first.argmax_only
    seq.out.append(7)
    assert seq.row() is first and list(first.output) == [7]  # kept, and it sees the new token
    seq.out.append(8)
    second = seq.row()
    assert second is not first and second.banned == () and list(second.output) == [7, 8]
    seq.out.append(9)
    assert seq.row() is second and list(second.output) == [7, 8, 9]
    del seq.out[1:]  # a stop string cut it (``finish``)
    assert seq.row().banned == (5, 6)


def test_a_batch_of_plain_greedy_rows_is_its_argmax_and_a_row_that_asks_more_gets_it():
    torch.manual_seed(0)
    logits = torch.randn(5, 50)
    plain = [Row(Sampling(0.0))] * 5
    assert all(r.argmax_only for r in plain)
    out = sample_batch(logits, plain)
    assert torch.equal(out.tokens, logits.argmax(-1, keepdim=True)) and not out.failed and not out.logprobs
    rows = plain[:4] + [Row(Sampling(0.0), logprobs=2)]
    assert not rows[-1].argmax_only
    out = sample_batch(logits, rows)
    assert torch.equal(out.tokens, logits.argmax(-1, keepdim=True)) and set(out.logprobs) == {4}
    banned = plain[:4] + [Row(Sampling(0.0), banned=(int(logits[4].argmax()),))]
    assert not banned[-1].argmax_only
    assert int(sample_batch(logits, banned).tokens[4]) != int(logits[4].argmax())


def _full_sort_cut(x, rows):
    """top_k and top_p from a sort of each whole row, as the sampler cut them before it took
    its candidates from a ``topk``: the reference (on rows without ties)."""
    v = x.size(1)
    sorted_x, order = torch.sort(x, dim=-1, descending=True)
    k = torch.tensor([min(q.top_k, v) if q.top_k is not None else v for q in rows]).unsqueeze(1)
    rank = torch.arange(v).unsqueeze(0)
    sorted_x = sorted_x.masked_fill(rank >= k, float("-inf"))
    p = torch.tensor(
        [q.top_p if q.top_p is not None and q.top_p < 1 else 2.0 for q in rows], dtype=torch.float64
    ).unsqueeze(1)
    probs = torch.softmax(sorted_x, dim=-1).double()
    before = torch.cumsum(probs, dim=-1) - probs
    drop = (before >= p) | (rank >= k)
    drop[:, 0] = False
    return x.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))


def test_top_k_and_top_p_from_the_best_candidates_cut_as_a_full_sort_does():
    """``_top_k_top_p`` cuts from a ``topk`` of the widest cut any row needs, and measures a top_p
    row whose nucleus is wider on a sort of its row: the kept tokens are the full sort's, row by
    row, on peaked and flat rows (wider than the first candidates), with and without top_k, mixed
    in one batch. (No ties and no top_p within float rounding of 1: there either answer is right.)"""
    from tinyllm.engine.sampler import _top_k_top_p

    gen = torch.Generator().manual_seed(7)
    checked = wide = 0
    for scale in (0.05, 1.0, 4.0):
        for v in (7, 300, 4096):
            x = torch.randn(12, v, generator=gen) * scale
            rows = [
                Sampling(0.8, top_k=k, top_p=p)
                for k, p in [
                    (None, 0.5),
                    (None, 0.9),
                    (None, 0.99),
                    (10, None),
                    (50, 0.9),
                    (3, 0.5),
                    (None, None),
                    (v + 5, 0.9),
                    (1, None),
                    (300, 0.95),
                    (None, 1e-9),
                    (2, 0.99),
                ]
            ]
            new, old = _top_k_top_p(x, rows), _full_sort_cut(x, rows)
            assert torch.equal(new == float("-inf"), old == float("-inf")), (scale, v)
            assert torch.equal(new[new > float("-inf")], x[new > float("-inf")])  # kept logits unchanged
            checked += 1
            kept = (new > float("-inf")).sum(dim=-1)
            wide += int((kept[:3] > min(v, 300)).sum())  # more than the candidates (300: the widest top_k)
    assert checked == 9 and wide > 0  # the sort for wide nuclei was taken


def test_a_cut_keeps_the_same_tied_tokens_whatever_else_is_in_the_batch():
    """Logits with many exact ties (bf16 values, as on CUDA under autocast): a row's top_k and
    top_p cut, and a seeded row's drawn token, are the same solo and beside rows that widen the
    candidates (a top_k of 1000, a flat top_p row sorted in full); ties at the boundary go to the
    lowest token ids."""
    from tinyllm.engine.sampler import _top_k_top_p

    gen = torch.Generator().manual_seed(11)
    neighbours = [Sampling(1.0, top_k=1000), Sampling(1.0, top_p=0.999), Sampling(1.0)]
    for trial in range(40):
        x = (torch.randn(1, 4096, generator=gen) * 2).bfloat16().float()
        flat = (torch.randn(1, 4096, generator=gen) * 0.01).bfloat16().float()
        for mine in (
            Sampling(1.0, top_k=40, seed=trial),
            Sampling(1.0, top_p=0.5, seed=trial),
            Sampling(1.0, top_k=7, top_p=0.3, seed=trial),
        ):
            solo = _top_k_top_p(x, [mine])
            for other in neighbours:
                batch = torch.cat([x, flat])
                assert torch.equal(_top_k_top_p(batch, [mine, other])[0], solo[0]), (trial, mine, other)
                assert torch.equal(
                    sample_batch(batch, [Row(mine), Row(other)]).tokens[0], sample_batch(x, [Row(mine)]).tokens[0]
                )
            kept = solo[0] > float("-inf")
            last = x[0][kept].min()
            tied = (x[0] == last).nonzero().flatten()
            assert kept[tied].tolist() == sorted(kept[tied].tolist(), reverse=True)  # lowest ids first


def _dense_penalties(x, rows):
    """The penalties over the whole vocabulary, as the sampler computed them before it computed
    only the (row, token) pairs that occur: the reference the sparse pass must equal."""
    from tinyllm.engine.sampler import _counts

    F32_MAX, TINY = torch.finfo(torch.float32).max, torch.finfo(torch.float32).tiny
    counts = _counts(x, [r.output if r.sampling.penalized else () for r in rows])
    seen_prompt = _counts(x, [r.prompt if r.sampling.repetition_penalty != 1 else () for r in rows]) > 0

    def col(vals):
        return torch.tensor(vals, dtype=torch.float32).unsqueeze(1)

    rep = col([min(max(r.sampling.repetition_penalty, TINY), F32_MAX) for r in rows])
    masked = x == float("-inf")
    seen = seen_prompt | (counts > 0)
    x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    x = x - col([r.sampling.frequency_penalty for r in rows]) * counts
    x = x - col([r.sampling.presence_penalty for r in rows]) * (counts > 0)
    return torch.where(masked, float("-inf"), x.clamp(-F32_MAX, F32_MAX))


def test_the_penalties_on_the_tokens_that_occur_equal_the_dense_pass():
    """Random batches mixing rows with and without each penalty, repeated and out-of-vocabulary
    ids, empty prompts and outputs, -inf, +inf and huge logits: the same values as the pass over
    the whole vocabulary, bit for bit (zero's sign aside: -0.0 == 0.0)."""
    import random

    rng = random.Random(3)
    gen = torch.Generator().manual_seed(3)
    for trial in range(60):
        b, v = rng.randint(1, 9), rng.choice([3, 17, 256])
        x = torch.randn(b, v, generator=gen) * rng.choice([0.5, 30.0])
        x[torch.rand(b, v, generator=gen) < 0.1] = float("-inf")
        if rng.random() < 0.3:
            x[0, 0] = float("inf")
        if rng.random() < 0.3:
            x[-1, -1] = 3e38
        rows = []
        for _ in range(b):
            s = Sampling(
                0.7,
                presence_penalty=rng.choice([0.0, -2.0, 0.7]),
                frequency_penalty=rng.choice([0.0, 2.0, -1.3]),
                repetition_penalty=rng.choice([1.0, 1.3, 0.5, 1e-30, 1e30]),
            )
            prompt = tuple(rng.randrange(v + 3) for _ in range(rng.choice([0, 1, 5, 40])))
            output = [rng.randrange(v + 3) for _ in range(rng.choice([0, 1, 6, 30]))]
            rows.append(Row(s, prompt, output))
        got, want = _penalize(x.clone(), rows), _dense_penalties(x.clone(), rows)
        assert torch.equal(got, want), (trial, got, want)
