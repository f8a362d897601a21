"""The paged decode attention, A/B inside one process (docs/speed.md): on a machine whose speed
moves ±30% from minute to minute, two processes run minutes apart measure the machine; the same
engine stepping each variant in turn, step after step, measures the variants.

    python scripts/attention_ab.py --model DIR|bundled --rows 64 --contexts ragged \
        --variants sdpa,100000,8192,4096,2048

Variants: ``native`` is the C kernel reading the pool in place (``tinyllm/native.py``); ``sdpa``
is the path before grouping (every decode row padded to the longest row's
window, one fused SDPA call, gathers allocated per layer); a number N is today's path with
``ragged.GROUP_TOKENS = N`` and the kernel off (100000: one group, i.e. no grouping). Contexts: ``uniform`` (96
tokens each), ``ragged`` (8..192), ``long`` (100..380). Prints the median step (ms) per variant.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from tinyllm import native
from tinyllm.engine import ContinuousEngine, Request
from tinyllm.kv import ragged
from tinyllm.kv.paged import gather_blocks
from tinyllm.model.checkpoint import load_checkpoint
from tinyllm.model.transformer import grouped_attention

CONTEXTS = {"uniform": (96, 96), "ragged": (8, 192), "long": (100, 380)}


def sdpa_one_window(self: ragged.RaggedAttention, q, kl, vl, kbuf, vbuf):
    """The decode attention before grouping: one window for all rows, the fused SDPA kernel."""
    bs, nd = self.pool.block_size, self.n_decode
    D, Hkv = q.size(-1), kl.size(1)
    dec = self.items[:nd]
    nb = -(-max(s + 1 for _, s, _ in dec) // bs)
    table = [self.pool.tables[sl][:nb] + [self.pool.scratch] * (nb - min(nb, len(self.pool.tables[sl])))
             for sl, _, _ in dec]
    blocks, W = torch.tensor(table).reshape(-1), nb * bs
    ends = torch.tensor([s for _, s, _ in dec])
    mask = (torch.arange(W)[None, :] <= ends[:, None])[:, None, None, :]
    keys = gather_blocks(kl, blocks, bs).view(nd, W, Hkv, D).transpose(1, 2)
    vals = gather_blocks(vl, blocks, bs).view(nd, W, Hkv, D).transpose(1, 2)
    return grouped_attention(q.transpose(0, 1).unsqueeze(2), keys, vals, mask).squeeze(2).transpose(0, 1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="bundled")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--contexts", choices=sorted(CONTEXTS), default="ragged")
    p.add_argument("--variants", default="sdpa,4096")
    p.add_argument("--steps", type=int, default=30, help="steps per variant")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model, _ = load_checkpoint(None if a.model == "bundled" else a.model)
    variants = a.variants.split(",")
    steps = a.steps * len(variants)
    lo, hi = CONTEXTS[a.contexts]
    rng = random.Random(1)
    eng = ContinuousEngine(model, a.rows, max_len=512, kv="paged", chunked_prefill=True,
                           max_batched_tokens=max(a.rows * hi, 256), prefix_cache=False)
    for _ in range(a.rows):
        eng.add_request(Request([rng.randrange(1, model.cfg.vocab_size) for _ in range(rng.randint(lo, hi))],
                                min(steps + 8, 512 - hi)))
    eng.step()
    eng.step()
    grouped = ragged.RaggedAttention._attend_decodes

    def use(v: str) -> None:
        native.ENABLED = v == "native"
        if v in ("sdpa", "native"):
            ragged.RaggedAttention._attend_decodes = sdpa_one_window
        else:
            ragged.RaggedAttention._attend_decodes = grouped
            ragged.GROUP_TOKENS = int(v)
    times: dict[str, list[float]] = {v: [] for v in variants}
    for v in variants:                                   # one warm step each
        use(v)
        eng.step()
    for i in range(steps):
        v = variants[i % len(variants)]
        use(v)
        t = time.perf_counter()
        eng.step()
        times[v].append(time.perf_counter() - t)
    print(a.model, a.rows, a.contexts, {v: round(statistics.median(ts) * 1e3, 2) for v, ts in times.items()})


if __name__ == "__main__":
    main()
