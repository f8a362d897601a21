"""Token choice (``sample_next``) and solo generation (``generate``), the reference output.

Every batched path in the engine must reproduce ``generate()`` token for token under greedy
decoding; that is the invariant the engine tests check.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from tinyllm.kv_cache import KVCache
from tinyllm.model import Transformer
from tinyllm.request import check_fits, is_greedy

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


def autocast(device: torch.device):
    """bf16 autocast on CUDA; full precision elsewhere (CPU bf16 is slower, not faster)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def generate(model: Transformer, prompt: list[int], max_new_tokens: int, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, eos_id: int | None = None,
             generator: torch.Generator | None = None) -> list[int]:
    """One request alone: prefill, then one token at a time. Returns the generated tokens
    (EOS included if produced)."""
    return list(generate_stream(model, prompt, max_new_tokens, temperature, top_k, top_p, eos_id, generator))


@torch.no_grad()
def generate_stream(model: Transformer, prompt: list[int], max_new_tokens: int, temperature: float = 0.0,
                    top_k: int | None = None, top_p: float | None = None, eos_id: int | None = None,
                    generator: torch.Generator | None = None) -> Iterator[int]:
    """Like ``generate`` but yields each token as soon as it is chosen."""
    if not prompt:
        raise ValueError("prompt must hold at least one token")
    check_fits(len(prompt), max_new_tokens, model.cfg.max_seq_len, "the model's max_seq_len")
    total = len(prompt) + max_new_tokens
    model.eval()
    device = next(model.parameters()).device
    cache = KVCache(model.cfg.n_layers, total)
    idx = torch.tensor([prompt], device=device)
    for _ in range(max_new_tokens):
        with autocast(device):
            logits, _ = model(idx, cache=cache)
        idx = sample_next(logits[:, -1], temperature, top_k, top_p, generator)
        tok = int(idx)
        yield tok
        if tok == eos_id:
            return
