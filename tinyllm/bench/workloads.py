"""The bench's workloads: the seeded default, the shared-prefix one, the long-tail one, a prompt file; and a random
Llama checkpoint of a given shape (``--random-model``), so any machine can measure offline."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from tinyllm.model.config import ModelConfig
from tinyllm.model.transformer import Transformer
from tinyllm.request import Request

RANDOM_DEFAULTS = dict(layers=4, d_model=256, heads=4, kv_heads=2, vocab=4096, d_ff=704, max_seq_len=512)


def default_workload(n: int, vocab: int, seed: int = 0, prompt_len=(8, 64), new=(8, 128)) -> list[Request]:
    """Seeded: prompt lengths and max_new_tokens uniform in the given ranges, greedy, no EOS
    (every path then produces exactly the same number of tokens)."""
    rng = random.Random(seed)
    return [
        Request([rng.randrange(1, vocab) for _ in range(rng.randint(*prompt_len))], rng.randint(*new)) for _ in range(n)
    ]


def shared_prefix_workload(
    n: int, vocab: int, seed: int = 0, prefix_len: int = 192, unique=(8, 64), new=(8, 128)
) -> list[Request]:
    """Chat/agent-like traffic: every request = one common ``prefix_len``-token prefix (a system
    prompt, a document) + its own 8..64 tokens; greedy, no EOS. What prefix caching is for."""
    rng = random.Random(seed)
    prefix = [rng.randrange(1, vocab) for _ in range(prefix_len)]
    return [
        Request(prefix + [rng.randrange(1, vocab) for _ in range(rng.randint(*unique))], rng.randint(*new))
        for _ in range(n)
    ]


SHARED_PREFIX = "shared-prefix"  # `--workload shared-prefix`: the built-in generated workload
LONG_TAIL = "long-tail"  # `--workload long-tail[-CAP]`: output lengths with a long tail
LONG_TAIL_CAPS = (32, 128, 384)  # selectable caps (Anyscale's benchmark: 32 / 128 / 512 / 1536)
LONG_TAIL_MEAN = 128  # the exponential's mean, before the cap


def long_tail_cap(name: str) -> int | None:
    """The cap of ``long-tail`` (the largest) or ``long-tail-CAP``; None for any other name."""
    if name == LONG_TAIL:
        return LONG_TAIL_CAPS[-1]
    tail = name.removeprefix(LONG_TAIL + "-")
    if tail != name and tail.isdigit() and int(tail) in LONG_TAIL_CAPS:
        return int(tail)
    return None


def long_tail_workload(
    n: int, vocab: int, cap: int = LONG_TAIL_CAPS[-1], seed: int = 0, prompt_len=(112, 128), mean: int = LONG_TAIL_MEAN
) -> list[Request]:
    """Anyscale's continuous-batching benchmark, scaled to a small model: ~128-token prompts and
    output lengths drawn from an exponential (mean ``mean``) capped at ``cap``, EOS ignored (every
    request runs to its length), seeded. Most requests are short and a few run to the cap: a
    static batch waits for its longest row, so this is where continuous batching pays most."""
    rng = random.Random(seed)
    return [
        Request(
            [rng.randrange(1, vocab) for _ in range(rng.randint(*prompt_len))],
            min(cap, max(1, round(rng.expovariate(1 / mean)))),
        )
        for _ in range(n)
    ]


def workload_from_file(path: Path, encode, default_new: int, max_len: int) -> list[Request]:
    """Prompts and max_new_tokens from a JSONL workload (sampling and arrivals ignored: greedy, all
    at t=0); every prompt checked to fit ``max_len`` (WorkloadError with file:line if not)."""
    from tinyllm.workload import load_workload, tokenize_checked

    items = load_workload(path)
    ids = tokenize_checked(items, path, encode, max_len, default_new)
    return [Request(p, it.max_new_tokens or default_new) for p, it in zip(ids, items)]


def line_slos(path: Path) -> list:
    """Each line's own "slo" (None where it has none), in the order workload_from_file runs them."""
    from tinyllm.workload import load_workload

    return [it.slo for it in load_workload(path)]


def parse_spec(spec: str) -> dict:
    """'layers=4,d_model=256,heads=4,kv_heads=2,vocab=4096' (any subset; the rest default)."""
    out = dict(RANDOM_DEFAULTS)
    if spec.strip() in ("", "default"):
        return out
    for part in spec.split(","):
        key, _, val = part.partition("=")
        key = key.strip()
        if key not in out or not val.strip().isdigit():
            raise ValueError(
                f"--random-model: bad item {part!r}; expected key=integer with keys {', '.join(RANDOM_DEFAULTS)}"
            )
        out[key] = int(val)
    return out


def random_checkpoint(spec: str, out: Path, seed: int = 0) -> Path:
    """A seeded random Llama checkpoint on disk, so tinyllm and transformers load the same weights."""
    from tokenizers import Tokenizer, models

    from tinyllm.model.checkpoint import save_checkpoint

    s = parse_spec(spec)
    torch.manual_seed(seed)
    fields = dict(
        vocab_size="vocab",
        d_model="d_model",
        n_layers="layers",
        n_heads="heads",
        n_kv_heads="kv_heads",
        d_ff="d_ff",
        max_seq_len="max_seq_len",
    )
    try:
        cfg = ModelConfig(**{field: s[key] for field, key in fields.items()})
    except ValueError as e:  # said in the spec's own keys
        msg = str(e)
        for field, key in fields.items():
            msg = msg.replace(f"ModelConfig.{field}", key)
        raise ValueError(f"--random-model: {msg}") from None
    model = Transformer(cfg)
    with torch.no_grad():  # spread logits: greedy ties between paths are then negligible
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    out.mkdir(parents=True, exist_ok=True)
    Tokenizer(models.WordLevel({f"t{i}": i for i in range(cfg.vocab_size)}, unk_token="t0")).save(
        str(out / "tokenizer.json")
    )
    save_checkpoint(model, out)
    return out
