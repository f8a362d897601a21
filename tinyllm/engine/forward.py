"""Running a plan on the model: the forward passes, apart from who runs (the schedulers) and what
follows (the engine's commit). nano-vllm's ``ModelRunner``, vLLM's ``GPUModelRunner``.

One forward for every scheduler: each pass is a ragged batch over a block pool (``ragged``):
the rows (slot, start, n) that a scheduler chose, flattened into one (1, T) batch, every token's
K/V written at its own position and attention over its own blocks (``kv/ragged.py``: the C
kernels on CPU in float32, PyTorch elsewhere). Static batching, the slot cache, the paged pool and
the token-budget scheduler differ in what they put in a pass and what storage they reserve, not
in the kernels that run it, so a race between them compares their decisions. The passes, by
``StepPlan.kind``:

- "prefill": the seed scheduler's admissions, each context whole (its slot's blocks claimed
  first, and given back if the forward raises, so a failed prefill leaves nothing to undo);
- "decode": one token for each running sequence;
- "mixed": decode tokens and prefill chunks together (the token-budget scheduler).

The one exception is a CUDA-graph decoder (``cuda_graph=True``, CUDA only): its graphs replay a
dense slot cache (``SlotKVCache``), so there a prefill is left-padded into a scratch ``KVCache``
(``prefill_padded``) and a decode computes every slot, idle ones included (``kernels`` says so).

Each returns the logits of the rows to sample, (rows, V); sampling is the commit's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tinyllm import native
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
    float32's). On the C kernels (every scheduler on CPU) a request still gets the same tokens
    alone or in any batch; on PyTorch's attention (CUDA, no compiler) the float noise between
    batch shapes, harmless at float32, can round a K/V value to the next bfloat16 step, so a long
    greedy run may pick another token. "float32" keeps a float32
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
    """A padded prefill's outcome (the CUDA-graph path): first-token logits (B, V) and the K/V
    for the dense slots."""

    logits: Tensor
    cache: KVCache
    pad: list[int]


Row = tuple[int, int, int]  # (slot, start, n): the slot computes context positions start..start+n-1


def kernels_of(cache: SlotKVCache | PagedKVCache) -> str:
    """Which kernels run a pass over ``cache``, in words (lane panels, the bench, the app)."""
    if isinstance(cache, SlotKVCache):
        return "CUDA graphs, dense slots"
    return kernels_for(cache.device, cache.k.dtype)


def kernels_for(device: torch.device | str, kv_dtype: torch.dtype) -> str:
    """Which kernels run a ragged pass on ``device`` over a pool of ``kv_dtype``, in words."""
    if torch.device(device).type == "cpu" and kv_dtype in native.POOL_DTYPES and native.library() is not None:
        return "C kernels"
    return "PyTorch attention"


def ragged_forward(model: Transformer, pool: PagedKVCache, rows: list[Row], flat: list[int], sample_at: list[int]):
    """The model over one ragged batch: ``rows`` in batch order (one-token rows first), ``flat``
    their tokens, ``sample_at`` the flat positions whose logits are returned, (len(sample_at), V).
    The rows' block tables must cover start + n tokens."""
    device = pool.device
    attn = RaggedAttention(pool, rows)
    idx = index_tensor(flat, device)[None]
    at = None if len(sample_at) == len(flat) else index_tensor(sample_at, device)  # None: every token
    with autocast(device):
        logits, _ = model(idx, cache=attn, logits_at=at)
    return logits[0]


def prefill_contexts(model: Transformer, pool: PagedKVCache, slots: list[int], contexts: list) -> Tensor:
    """Whole contexts computed from position 0 in their slots (whose blocks must cover them), as
    one ragged pass: the logits of each context's last token, (len(contexts), V), in the order
    given. (The pass runs one-token contexts first, RaggedAttention's rule.)"""
    order = sorted(range(len(contexts)), key=lambda i: len(contexts[i]) != 1)
    rows, flat, sample_at = [], [], []
    for i in order:
        rows.append((slots[i], 0, len(contexts[i])))
        flat += contexts[i]
        sample_at.append(len(flat) - 1)
    logits = ragged_forward(model, pool, rows, flat, sample_at)
    if order != sorted(order):  # back to the order given
        logits = logits[torch.tensor(order, device=logits.device).argsort()]
    return logits


class ModelRunner:
    """The model and its cache; ``runner(plan)`` runs the plan's forward pass. It writes K/V and
    claims a prefill's blocks (its storage), but no engine record."""

    def __init__(self, model: Transformer, pool: SlotKVCache | PagedKVCache, decoder=None):
        self.model, self.pool, self.decoder = model, pool, decoder  # decoder: a SlotGraphDecoder
        self.device = next(model.parameters()).device
        self.every_slot = isinstance(pool, SlotKVCache)  # the CUDA-graph path: dense slots
        self.last_tok = torch.zeros(pool.n_slots, 1, dtype=torch.long, device=self.device)  # its decode input
        self.kernels = kernels_of(pool)

    def __call__(self, plan: StepPlan) -> Tensor | Prefilled:
        if plan.kind == "prefill":
            return self.prefill_padded(plan.items) if self.every_slot else self.prefill(plan)
        if plan.kind == "decode" and self.every_slot:
            return self.decode_every_slot()
        return self.mixed(plan.items)

    def prefill(self, plan: StepPlan) -> Tensor:
        """The seed scheduler's admissions: each context whole, in the slot it takes
        (``plan.slots``), whose blocks are claimed here and given back if the forward raises.
        Logits (rows, V) in the plan's order."""
        pool = self.pool
        try:
            for slot, (_, _, n) in zip(plan.slots, plan.items):
                pool.occupy(slot, n)  # (lens[slot] = n: the forward below computes them)
            return prefill_contexts(self.model, pool, plan.slots, [seq.context() for seq, _, _ in plan.items])
        except BaseException:
            for slot in plan.slots:  # (releasing a slot not yet claimed changes nothing)
                pool.release(slot)
            raise

    def prefill_padded(self, items: list[Item]) -> Prefilled:
        """The CUDA-graph path's prefill: left-padded into a scratch cache, moved into the slots
        by the commit."""
        contexts = [seq.context() for seq, _, _ in items]
        return Prefilled(
            *prefill_padded(self.model, contexts, max_len=max(len(c) for c in contexts), kv_dtype=self.pool.k.dtype)
        )

    def decode_every_slot(self) -> Tensor:
        """The CUDA-graph path's decode: every slot's next-token logits (S, V), from ``last_tok``
        (the engine keeps it current)."""
        if self.decoder is not None:
            return self.decoder.step(self.last_tok)[:, -1]
        with autocast(self.device):
            logits, _ = self.model(self.last_tok, cache=self.pool)  # one token per slot
        return logits[:, -1]

    def mixed(self, items: list[Item]) -> Tensor:
        """The model over ``items`` as one ragged batch (one-token items first: the schedulers
        order them so); logits (S, V) at the positions that sample (each item whose context is
        then complete), in batch order."""
        flat, sample_at, rows = [], [], []
        for seq, start, n in items:
            rows.append((seq.slot, start, n))
            prompt, out = seq.req.prompt, seq.out
            P = len(prompt)
            if seq.draft:  # a decode with a speculative draft: its newest token, the draft, logits at each
                flat += [prompt[start] if start < P else out[start - P], *seq.draft]
                sample_at += range(len(flat) - n, len(flat))
                continue
            if n == 1:  # a decode: one token, no copy of the context
                flat.append(prompt[start] if start < P else out[start - P])
            else:
                flat += [*prompt[start : start + n], *out[max(0, start - P) : max(0, start + n - P)]]
            if start + n == P + len(out):  # context complete: its last logits sample
                sample_at.append(len(flat) - 1)
        return ragged_forward(self.model, self.pool, rows, flat, sample_at)
