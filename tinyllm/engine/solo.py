"""Solo generation (``generate``): one request alone, the reference output.

Every batched path in the engine must reproduce ``generate()`` token for token under greedy
decoding; that is the invariant the engine tests check.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import torch

from tinyllm.engine.forward import kv_cache_dtype as kv_cache_dtype_of
from tinyllm.engine.sampler import sample_next
from tinyllm.kv.dense import KVCache
from tinyllm.model.device import autocast
from tinyllm.model.transformer import Transformer
from tinyllm.request import Request, check_fits


@torch.no_grad()
def generate_stream(
    model: Transformer,
    prompt: list[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    kv_cache_dtype: str = "auto",
) -> Iterator[int]:
    """One request alone, each token yielded as soon as it is chosen (``generate`` collects them)."""
    device = next(model.parameters()).device
    kv_dtype = kv_cache_dtype_of(device, kv_cache_dtype)
    prompt = list(Request(prompt, max_new_tokens, eos_id).prompt)  # refused as a Request would be
    check_fits(len(prompt), max_new_tokens, model.cfg.max_seq_len, "the model's max_seq_len")
    total = len(prompt) + max_new_tokens
    model.eval()
    cache = KVCache(model.cfg.n_layers, total, dtype=kv_dtype)
    idx = torch.tensor([prompt], device=device)
    for _ in range(max_new_tokens):
        with autocast(device):
            logits, _ = model(idx, cache=cache)
        idx = sample_next(logits[:, -1], temperature, top_k, top_p, generator)
        tok = int(idx)
        yield tok
        if tok == eos_id:
            return


def generate(*args: Any, **kwargs: Any) -> list[int]:
    """One request alone: prefill, then one token at a time. Returns the generated tokens
    (EOS included if produced). Takes ``generate_stream``'s arguments (help() shows them);
    ``kv_cache_dtype``: its K/V kept as an engine's would be (forward.kv_cache_dtype), the
    reference for an engine with that setting."""
    return list(generate_stream(*args, **kwargs))


# help() and inspect.signature show generate_stream's parameters, and this function's return
generate.__signature__ = inspect.signature(generate_stream).replace(  # type: ignore[attr-defined]
    return_annotation="list[int]"
)
