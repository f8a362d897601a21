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

import torch

from step_ab import ab_arguments, alternate           # the shared A/B harness (this directory)
from tinyllm import native
from tinyllm.kv import ragged
from tinyllm.kv.paged import gather_blocks
from tinyllm.model.transformer import grouped_attention


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
    a = ab_arguments(__doc__, "sdpa,4096", 30)
    grouped = ragged.RaggedAttention._attend_decodes

    def use(v: str) -> None:
        native.ENABLED = v == "native"
        if v in ("sdpa", "native"):
            ragged.RaggedAttention._attend_decodes = sdpa_one_window
        else:
            ragged.RaggedAttention._attend_decodes = grouped
            ragged.GROUP_TOKENS = int(v)
    med = alternate(a, use)
    print(a.model, a.rows, a.contexts, {v: round(m, 2) for v, m in med.items()})


if __name__ == "__main__":
    main()
