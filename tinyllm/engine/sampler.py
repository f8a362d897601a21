"""Sampling, in one place: ``sample_batch`` picks the next token of every row of a batch, each row
with its own settings, in one vectorised pass (solo generation and the static batcher call it
through ``sample_next``, one setting for all rows).

The pass, vLLM's order: penalties on the logits (repetition, then frequency and presence), a
ban on the tokens that may not end a request before its ``min_tokens``, then greedy rows take
the argmax; sampled rows divide by their temperature, cut to top_k, top_p and min_p, and draw by
inverse CDF from one uniform number per row. A seeded row's uniform is a hash of (seed, tokens it
has generated), so its draws depend on nothing else in the batch: the same tokens solo, batched,
recomputed after a preemption or served from the prefix cache. Per-row settings are tensors
(B,), per-row token counts a (B, V) tensor; no Python loop runs torch per row.

Total over every setting ``Sampling`` accepts: values beyond float32 are clamped, a cut always
keeps the most likely token, a ban that would leave a row nothing is dropped for that row. A row
whose distribution is still not a distribution (NaN logits: the unforeseen) fails alone.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor

from tinyllm import native
from tinyllm.request import Sampling, TokenLogprob, is_greedy

_F32_MAX = torch.finfo(torch.float32).max
_F32_TINY = torch.finfo(torch.float32).tiny
_NEG_INF = float("-inf")


@dataclass(frozen=True)
class Row:
    """What the sampler needs of one row besides its logits."""

    sampling: Sampling
    prompt: Seq[int] = ()  # read only when a penalty is on
    output: Seq[int] = ()  # generated so far: penalties, and a seeded row's position
    banned: tuple[int, ...] = ()  # may not be drawn now (EOS / stop ids before min_tokens)
    logprobs: int | None = None  # report the chosen token's logprob and this many alternatives

    @cached_property
    def argmax_only(self) -> bool:
        """Greedy, no penalty, no ban, no logprobs: its token is its logits' argmax and nothing
        else is computed for it (a sequence keeps its Row while this holds: ``Sequence.row``)."""
        s = self.sampling
        return is_greedy(s.temperature) and not s.penalized and not self.banned and self.logprobs is None

    @cached_property
    def draftable(self) -> bool:
        """A speculative draft for this row is verified exactly: its token is the argmax, or an
        unseeded draw with no penalty or ban (rejection sampling keeps its distribution: a seeded
        row draws by position, which a draft would shift); no logprobs."""
        s = self.sampling
        plain = not s.penalized and not self.banned and self.logprobs is None
        return plain and (is_greedy(s.temperature) or s.seed is None)


@dataclass
class Sampled:
    """The batch's tokens (B, 1); rows whose sampling failed (row → why; their token is 0 and
    must not be used); logprobs of the rows that asked (row → TokenLogprob)."""

    tokens: Tensor
    failed: dict[int, str] = field(default_factory=dict)
    logprobs: dict[int, TokenLogprob] = field(default_factory=dict)


def sample_next(
    logits: Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Next token per row, every row with the same setting: logits (B, V) → (B, 1). A
    temperature below ``GREEDY_BELOW`` is greedy (argmax, no randomness used)."""
    s = Sampling(temperature, top_k, top_p)
    out = sample_batch(logits, [Row(s)] * logits.size(0), generator)
    if out.failed:
        raise RuntimeError(next(iter(out.failed.values())))
    return out.tokens


def sample_rows(logits: Tensor, rows: list[Sampling], generator=None) -> tuple[Tensor, dict[int, str]]:
    """Next token per row (B, V) → (B, 1) for rows with settings only (no penalties' history,
    no bans), and the rows whose sampling failed."""
    out = sample_batch(logits, [Row(s) for s in rows], generator)
    return out.tokens, out.failed


def sample_batch(logits: Tensor, rows: list[Row], generator: torch.Generator | None = None) -> Sampled:
    """Next token of every row (see the module docstring). Unseeded rows draw from
    ``generator`` (one call for all of them); an error no row can be blamed for fails them all."""
    try:
        return _sample(logits, rows, generator)
    except Exception as e:  # noqa: BLE001 - the caller fails these rows, goes on
        why = f"sampling failed: {type(e).__name__}: {e}"
        return Sampled(_zeros(logits), {i: why for i in range(len(rows))})


def _sample(logits: Tensor, rows: list[Row], generator) -> Sampled:
    x = logits.float()
    if all(r.argmax_only for r in rows):  # (the common batch: one pass over the rows)
        return Sampled(_argmax(x))
    dev = logits.device
    settings = [r.sampling for r in rows]
    if any(s.penalized for s in settings):
        x = _penalize(x, rows)
    if any(r.banned for r in rows):
        x = _ban(x, rows)
    failed: dict[int, str] = {}
    drawn = [i for i, s in enumerate(settings) if not is_greedy(s.temperature)]
    if len(drawn) == len(rows):  # every row draws: no argmax, no copy of the logits
        tokens, bad = _draw(x, rows, generator)
    else:
        tokens = _argmax(x)
        if drawn:
            ix = torch.tensor(drawn, device=dev)
            picked, bad = _draw(x[ix], [rows[i] for i in drawn], generator)
            tokens[ix] = picked
    if drawn:
        for j in bad.nonzero().flatten().tolist():
            failed[drawn[j]] = "sampling failed: the row's probabilities are not a distribution (NaN or inf logits)"
            tokens[drawn[j]] = 0
    return Sampled(tokens, failed, _logprobs(logits, tokens, rows))


def _argmax(x: Tensor) -> Tensor:
    """Each row's argmax (B, 1): C where it can (PyTorch's CPU argmax is slow)."""
    tokens = native.argmax(x)
    return x.argmax(dim=-1, keepdim=True) if tokens is None else tokens


def _penalize(x: Tensor, rows: list[Row]) -> Tensor:
    """vLLM's penalties, every row at once: repetition divides positive logits (multiplies
    negative ones) of tokens in the prompt or output; frequency subtracts per output occurrence,
    presence once per output token. Computed on the (row, token) pairs that occur only (a few
    hundred a row, where a dense pass over the vocabulary took ~15 tensor ops of rows x vocab);
    every other logit keeps its value, clamped to float32's range as the rest."""
    v, dev = x.size(1), x.device
    out_keys = _keys(v, dev, [r.output if r.sampling.penalized else () for r in rows])
    prompt_keys = _keys(v, dev, [r.prompt if r.sampling.repetition_penalty != 1 else () for r in rows])
    out_unique, out_counts = torch.unique(out_keys, return_counts=True)
    keys = torch.unique(torch.cat([out_unique, prompt_keys]))  # every (row, token) seen, sorted
    counts = torch.zeros(keys.numel(), dtype=torch.float32, device=dev)
    counts[torch.searchsorted(keys, out_unique)] = out_counts.float()
    row = keys // v

    def col(vals: list[float]) -> Tensor:
        return torch.tensor(vals, dtype=torch.float32, device=dev)[row]

    rep = col([min(max(r.sampling.repetition_penalty, _F32_TINY), _F32_MAX) for r in rows])
    flat = x.reshape(-1)
    seen = flat[keys]
    y = torch.where(seen > 0, seen / rep, seen * rep)
    y = y - col([r.sampling.frequency_penalty for r in rows]) * counts
    y = y - col([r.sampling.presence_penalty for r in rows]) * (counts > 0)
    out = x.clamp(max=_F32_MAX).contiguous()  # -inf stays masked; +inf becomes the largest float
    out.view(-1)[keys] = torch.where(seen == _NEG_INF, _NEG_INF, y.clamp(-_F32_MAX, _F32_MAX))
    return out


def _keys(v: int, dev, ids: list[Seq[int]]) -> Tensor:
    """Each row's token ids (ids >= v ignored) as flat keys row * v + id, int64."""
    lens = [len(t) for t in ids]
    if not any(lens):
        return torch.empty(0, dtype=torch.long, device=dev)
    flat = torch.tensor([t for seq in ids for t in seq], dtype=torch.long, device=dev)
    row = torch.repeat_interleave(torch.arange(len(ids), device=dev), torch.tensor(lens, device=dev))
    keep = flat < v
    return (row * v + flat)[keep]


def _counts(x: Tensor, ids: list[Seq[int]]) -> Tensor:
    """(B, V) float: how often each token id occurs in each row's ``ids`` (ids >= V ignored)."""
    n, v = x.shape
    keys = _keys(v, x.device, ids)
    return torch.bincount(keys, minlength=n * v).to(torch.float32).view(n, v)


def _ban(x: Tensor, rows: list[Row]) -> Tensor:
    """Mask each row's banned ids, except in a row where that would leave no token at all."""
    banned = x.masked_fill(_counts(x, [r.banned for r in rows]) > 0, _NEG_INF)
    left = (banned > _NEG_INF).any(dim=-1, keepdim=True)
    return torch.where(left, banned, x)


def _draw(x: Tensor, rows: list[Row], generator) -> tuple[Tensor, Tensor]:
    """Sampled rows: temperature, top_k, top_p, min_p, then one inverse-CDF draw per row.
    Returns the tokens (b, 1) and which rows had no valid distribution."""
    b, v = x.shape
    dev = x.device
    probs = _probs(x, rows)
    cdf = torch.cumsum(probs, dim=-1)
    total = cdf[:, -1:]
    bad = ~torch.isfinite(total).squeeze(1) | (total.squeeze(1) <= 0)
    u = _uniforms(rows, generator, dev)
    tok = torch.searchsorted(cdf, (u * total).clamp(min=0), right=True)
    ids = torch.arange(v, device=dev).expand(b, v)
    last = torch.where(probs > 0, ids, 0).max(dim=-1, keepdim=True).values  # the last possible token
    return torch.minimum(tok, last), bad


def target_probs(logits: Tensor, row: Row) -> Tensor:
    """The distribution ``row``'s token is drawn from at each row of ``logits`` (n, V), float64:
    temperature, top_k, top_p, min_p, as ``_draw`` draws (a speculative draft's verification:
    engine/commit.py). For a row with no penalty and no ban."""
    return _probs(logits.float(), [row] * logits.size(0))


def _probs(x: Tensor, rows: list[Row]) -> Tensor:
    """Each sampled row's distribution after temperature, top_k, top_p and min_p, float64."""
    v, dev = x.size(1), x.device
    s = [r.sampling for r in rows]
    masked = x == _NEG_INF
    temp = torch.tensor([min(q.temperature, _F32_MAX) for q in s], dtype=torch.float32, device=dev).unsqueeze(1)
    x = torch.where(masked, _NEG_INF, (x / temp).clamp(-_F32_MAX, _F32_MAX))
    if any(q.top_k is not None and q.top_k < v for q in s) or any(q.top_p is not None and q.top_p < 1 for q in s):
        x = _top_k_top_p(x, s)
    if any(q.min_p > 0 for q in s):
        probs = torch.softmax(x, dim=-1)
        floor = torch.tensor([q.min_p for q in s], dtype=torch.float32, device=dev).unsqueeze(1)
        x = x.masked_fill(probs < floor * probs.max(dim=-1, keepdim=True).values, _NEG_INF)
    return torch.softmax(x, dim=-1).double()


def _top_k_top_p(x: Tensor, s: list[Sampling]) -> Tensor:
    """Per-row top_k and top_p; the most likely token always stays. The candidates come from one
    ``topk`` of the widest cut any row needs (at least ``_TOP_FIRST``), not a sort of the whole
    vocabulary (a 64 x 4,096 sort is ~10 ms on CPU, more than a d256 model's forward); a top_p
    row whose nucleus is wider than that is measured on a sort of its row. A row keeps the n
    tokens its cut decides, the lowest token ids first among logits tied at the boundary: what it
    keeps depends on its own logits and settings only, never on the rest of the batch (a seeded
    row draws the same token solo or batched)."""
    b, v = x.shape
    k = [min(q.top_k, v) if q.top_k is not None else v for q in s]
    p = [q.top_p if q.top_p is not None and q.top_p < 1 else 2.0 for q in s]
    width = max([kk for kk in k if kk < v] + [min(v, _TOP_FIRST) if min(p) <= 1 else 1])
    kt = torch.tensor(k, device=x.device).unsqueeze(1)
    pt = torch.tensor(p, dtype=torch.float64, device=x.device).unsqueeze(1)
    vals, order = torch.topk(x, width, dim=-1)  # each row's `width` best, descending
    whole = any(kk >= v for kk in k)  # a row's probabilities over the vocabulary
    n, wide = _cut_size(x, vals, order, kt, pt, whole)
    last = vals.gather(-1, (n - 1).clamp(max=width - 1))  # each row's smallest kept logit
    if bool(wide.any()):  # nuclei wider than the candidates
        rows = wide.nonzero().flatten()
        full_vals, full_order = torch.sort(x[rows], dim=-1, descending=True)
        n[rows], _ = _cut_size(x[rows], full_vals, full_order, kt[rows], pt[rows], True)
        last[rows] = full_vals.gather(-1, n[rows] - 1)
    above, at = x > last, x == last
    keep = above | (at & (at.cumsum(dim=-1) <= n - above.sum(dim=-1, keepdim=True)))
    keep.scatter_(-1, order[:, :1], True)  # the most likely (a NaN row fails later)
    keep |= (kt >= v) & (pt > 1)  # rows with neither cut keep everything
    return x.masked_fill(~keep, _NEG_INF)


_TOP_FIRST = 256  # candidates a top_p row is first cut from (a nucleus wider than this: a sort)


def _cut_size(x: Tensor, vals: Tensor, order: Tensor, kt: Tensor, pt: Tensor, whole: bool) -> tuple[Tensor, Tensor]:
    """How many tokens each row keeps, from its best logits ``vals`` (descending, at ``order``):
    its top_k, and its top_p over the probabilities a sort of the whole row gives (a softmax over
    its top_k where it has one, else over the whole vocabulary); and which rows' top_p needs more
    than these candidates. Tied logits have equal probabilities, so the count does not depend on
    how ties are ordered. ``whole``: some row has no top_k (else no softmax over the vocabulary)."""
    v, width = x.size(1), vals.size(1)
    rank = torch.arange(width, device=x.device).unsqueeze(0)
    cut_k = vals.masked_fill(rank >= kt, _NEG_INF)
    probs = torch.softmax(cut_k, dim=-1)
    if whole:
        probs = torch.where(kt < v, probs, torch.softmax(x, dim=-1).gather(-1, order))
    probs = probs.double()
    before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly more likely tokens
    drop = (before >= pt) | (rank >= kt)
    drop[:, 0] = False
    wide = ((pt <= 1) & (kt > width) & (before[:, -1:] + probs[:, -1:] < pt)).squeeze(1)
    return (~drop).sum(dim=-1, keepdim=True), wide


_MIX1, _MIX2, _GOLDEN = -0x40A7B892E31B1A47, -0x6B2FB644ECCEEE15, -0x61C8864680B583EB  # splitmix64's, as int64


def _mix(z: Tensor) -> Tensor:
    """splitmix64's finaliser on int64 (wrapping arithmetic; logical shifts by masking)."""
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def _shr(z: Tensor, k: int) -> Tensor:
    return (z >> k) & ((1 << (64 - k)) - 1)


def seeded_uniforms(seeds: Tensor, positions: Tensor) -> Tensor:
    """A uniform in [0, 1) per (seed, position), float64: a counter-based generator, so a
    seeded row's draw at position n is the same whatever else runs and however often it is recomputed."""
    h = _mix(_mix(seeds + _GOLDEN) + positions * _GOLDEN)
    return _shr(h, 11).double() * (2.0**-53)


def _uniforms(rows: list[Row], generator, dev) -> Tensor:
    """(b, 1): seeded rows from their (seed, tokens generated); the others from ``generator``."""
    seeded = [i for i, r in enumerate(rows) if r.sampling.seed is not None]
    u = torch.empty(len(rows), dtype=torch.float64, device=dev)
    if len(seeded) < len(rows):
        free = [i for i, r in enumerate(rows) if r.sampling.seed is None]
        gen_dev = generator.device if generator is not None else dev
        draws = torch.rand(len(free), dtype=torch.float64, generator=generator, device=gen_dev)
        u[torch.tensor(free, device=dev)] = draws.to(dev)
    if seeded:
        seeds = torch.tensor([rows[i].sampling.seed for i in seeded], dtype=torch.long, device=dev)
        pos = torch.tensor([len(rows[i].output) for i in seeded], dtype=torch.long, device=dev)
        u[torch.tensor(seeded, device=dev)] = seeded_uniforms(seeds, pos)
    return u.unsqueeze(1)


def _logprobs(logits: Tensor, tokens: Tensor, rows: list[Row]) -> dict[int, TokenLogprob]:
    """For the rows that asked: the chosen token's logprob under the model's own distribution
    and the top alternatives. Nothing is computed when no row asks."""
    ask = [i for i, r in enumerate(rows) if r.logprobs is not None]
    if not ask:
        return {}
    ix = torch.tensor(ask, device=logits.device)
    lp = torch.log_softmax(logits[ix].float(), dim=-1)
    chosen = lp.gather(1, tokens[ix]).squeeze(1).tolist()
    n = min(max(rows[i].logprobs for i in ask), lp.size(-1))
    top_v, top_i = torch.topk(lp, n, dim=-1) if n else (lp[:, :0], lp[:, :0].long())
    ranks = (lp > lp.gather(1, tokens[ix])).sum(1).add(1).tolist()  # 1 + tokens strictly likelier
    top_v, top_i, toks = top_v.tolist(), top_i.tolist(), tokens[ix].squeeze(1).tolist()
    return {
        i: TokenLogprob(
            toks[j], chosen[j], tuple(zip(top_i[j][: rows[i].logprobs], top_v[j][: rows[i].logprobs])), ranks[j]
        )
        for j, i in enumerate(ask)
    }


def _zeros(logits: Tensor) -> Tensor:
    return torch.zeros(logits.size(0), 1, dtype=torch.long, device=logits.device)
