"""Write prompts/long_tail.jsonl: the long-tail workload (``tinyllm bench --workload long-tail``) as
a prompt file for the app and the race. 64 prompts of ~128 tokens of the bundled model's own
Shakespeare (seeded samples from it), greedy, EOS ignored, each with the output length the bench's
long-tail workload draws (exponential, mean 128, capped at 384; same seed).

    python scripts/make_long_tail_prompts.py [--out prompts/long_tail.jsonl]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from tinyllm.bench.workloads import LONG_TAIL_CAPS, long_tail_workload
from tinyllm.engine.solo import generate
from tinyllm.model.checkpoint import load_checkpoint

OPENERS = (
    "ROMEO.\n",
    "JULIET.\n",
    "HAMLET.\n",
    "KING LEAR.\n",
    "OTHELLO.\n",
    "PORTIA.\n",
    "MACBETH.\n",
    "FIRST CITIZEN.\n",
)


def main() -> None:
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "prompts" / "long_tail.jsonl"))
    p.add_argument("--n", type=int, default=64)
    a = p.parse_args()
    torch.set_num_threads(1)
    model, tok = load_checkpoint()
    lengths = [r.max_new_tokens for r in long_tail_workload(a.n, model.cfg.vocab_size, LONG_TAIL_CAPS[-1])]
    gen = torch.Generator().manual_seed(0)
    lines = []
    for i, new in enumerate(lengths):
        ids = tok.encode(OPENERS[i % len(OPENERS)])
        ids = ids + generate(model, ids, 126 - len(ids), temperature=0.8, top_k=40, generator=gen)
        text = tok.decode(ids)
        n = len(tok.encode(text))
        assert n <= 128, n  # static batching pads a batch to its longest prompt: 128 + the cap 384 fits 512
        lines.append(json.dumps({"prompt": text, "max_new_tokens": new, "temperature": 0, "stop_at_eos": False}))
    Path(a.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {a.out}: {len(lines)} prompts, {sum(lengths)} output tokens in all")


if __name__ == "__main__":
    main()
