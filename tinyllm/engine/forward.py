"""Running a plan on the model: the forward passes, apart from who runs (the schedulers) and what
follows (the engine's commit). nano-vllm's ``ModelRunner``, vLLM's ``GPUModelRunner``.

Three passes, one per ``StepPlan.kind``:

- "prefill": the contexts left-padded into one batch (``prefill_padded``: a padded row computes
  what it would alone); the K/V stays in a scratch ``KVCache`` until the engine commits it into
  the slots, so a failed prefill leaves nothing to undo;
- "decode": on the slot cache, one token for every slot, from each slot's last token (idle slots
  compute a throwaway row), eagerly or by replaying a CUDA graph; on the paged pool, one token for
  each running sequence only, as a ragged batch (its idle slots cost nothing: a pool sized by
  memory may have many more slots than it runs);
- "mixed": decode tokens and prefill chunks flattened into one ragged batch over the paged pool
  (``kv/ragged.py``); logits only where a context is then complete.

Each returns the logits of the rows to sample, (rows, V); sampling is the commit's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tinyllm.engine.scheduler import Item, StepPlan
from tinyllm.kv.dense import KVCache, SlotKVCache
from tinyllm.kv.paged import PagedKVCache
from tinyllm.kv.ragged import RaggedAttention, index_tensor
from tinyllm.model.device import autocast
from tinyllm.model.transformer import Transformer
from tinyllm.request import KV_CACHE_DTYPES


def kv_cache_dtype(device: torch.device | str, name: str = "auto") -> torch.dtype:
    """The element type of the K/V caches for ``name`` (vLLM's ``kv_cache_dtype``): "auto" is what
    the model computes K/V in (bfloat16 under CUDA's autocast, float32 on CPU); "bfloat16" on a
    float32 CPU model halves the KV memory (twice the sequences a budget buys) and the bytes each
    attention reads, at bfloat16's precision (8 bits of mantissa: greedy text can then differ from
    float32's). On the C kernels (the token-budget engine on CPU) a request still gets the same
    tokens alone or in any batch; on PyTorch's attention (static batching, the slot cache, a padded
    prefill, CUDA) the float noise between batch shapes, harmless at float32, can round a K/V value
    to the next bfloat16 step, so a long greedy run may pick another token. "float32" keeps a float32
    CPU model's full precision (on CUDA the model computes K/V in bfloat16 under autocast, so a
    float32 cache there only holds the same values in twice the memory)."""
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(map(repr, KV_CACHE_DTYPES))}, got {name!r}")
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return getattr(torch, name)


def kv_cache_dtype_name(device: torch.device | str, name: str = "auto") -> str:
    """``kv_cache_dtype`` resolved, as a name: "float32", "bfloat16" (what snapshots and reports say)."""
    return str(kv_cache_dtype(device, name)).removeprefix("torch.")


def kv_bytes_per_token(model: Transformer, device: torch.device, kv_dtype: str = "auto") -> int:
    """Bytes of K/V one token holds in every layer's cache, at ``kv_dtype`` (a KV_CACHE_DTYPES name)."""
    elem = kv_cache_dtype(device, kv_dtype).itemsize
    return sum(layer.self_attn.cache_bytes_per_token(elem) for layer in model.layers)


@torch.no_grad()
def prefill_padded(
    model: Transformer, prompts: list[list[int]], max_len: int, pad_id: int = 0, kv_dtype: torch.dtype | None = None
) -> tuple[Tensor, KVCache, list[int]]:
    """Left-pad prompts to one length, run one prefill. Returns last-position logits (B, V),
    the filled cache (pos = padded length, its K/V kept in ``kv_dtype``, None: as computed) and
    each row's pad count."""
    device = next(model.parameters()).device
    L = max(len(p) for p in prompts)
    pad = [L - len(p) for p in prompts]
    idx = torch.tensor([[pad_id] * n + list(p) for n, p in zip(pad, prompts)], device=device)
    cache = KVCache(model.cfg.n_layers, max_len, pad_lens=torch.tensor(pad, device=device), dtype=kv_dtype)
    with autocast(device):
        logits, _ = model(idx, cache=cache)
    return logits[:, -1], cache, pad


@dataclass
class Prefilled:
    """A prefill pass's outcome: first-token logits (B, V) and the K/V for the slots."""

    logits: Tensor
    cache: KVCache
    pad: list[int]


class ModelRunner:
    """The model and its cache; ``runner(plan)`` runs the plan's forward pass. It writes K/V (the
    decode and mixed passes into the cache, as any forward does) but no engine record."""

    def __init__(self, model: Transformer, cache: SlotKVCache | PagedKVCache, decoder=None):
        self.model, self.cache, self.decoder = model, cache, decoder  # decoder: a SlotGraphDecoder
        self.device = next(model.parameters()).device
        self.last_tok = torch.zeros(cache.n_slots, 1, dtype=torch.long, device=self.device)  # decode input
        self.every_slot = not isinstance(cache, PagedKVCache)  # a decode computes a row per slot

    def __call__(self, plan: StepPlan) -> Tensor | Prefilled:
        if plan.kind == "decode":
            return self.decode() if self.every_slot else self.mixed(plan.items)
        if plan.kind == "prefill":
            return self.prefill(plan.items)
        return self.mixed(plan.items)

    def prefill(self, items: list[Item]) -> Prefilled:
        contexts = [seq.context() for seq, _, _ in items]
        return Prefilled(
            *prefill_padded(self.model, contexts, max_len=max(len(c) for c in contexts), kv_dtype=self.cache.k.dtype)
        )

    def decode(self) -> Tensor:
        """Every slot's next-token logits (S, V), from ``last_tok`` (the engine keeps it current)."""
        if self.decoder is not None:
            return self.decoder.step(self.last_tok)[:, -1]
        with autocast(self.device):
            logits, _ = self.model(self.last_tok, cache=self.cache)  # one token per slot
        return logits[:, -1]

    def mixed(self, items: list[Item]) -> Tensor:
        """The model over ``items`` as one ragged batch; logits (S, V) at the positions that
        sample (each item whose context is then complete), in batch order."""
        flat, sample_at, rows = [], [], []
        for seq, start, n in items:
            rows.append((seq.slot, start, n))
            prompt, out = seq.req.prompt, seq.out
            P = len(prompt)
            if n == 1:  # a decode: one token, no copy of the context
                flat.append(prompt[start] if start < P else out[start - P])
            else:
                flat += [*prompt[start : start + n], *out[max(0, start - P) : max(0, start + n - P)]]
            if start + n == P + len(out):  # context complete: its last logits sample
                sample_at.append(len(flat) - 1)
        attn = RaggedAttention(self.cache, rows)
        idx = index_tensor(flat, self.device)[None]
        at = None if len(sample_at) == len(flat) else index_tensor(sample_at, self.device)  # None: every token
        with autocast(self.device):
            logits, _ = self.model(idx, cache=attn, logits_at=at)
        return logits[0]
