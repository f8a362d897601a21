"""Speculative decoding measured: tokens/s of the engine without speculation, with n-gram prompt
lookup and with the bundled draft model, at several running-sequence counts, on a lookup-friendly
workload (prompts the model continues by repeating text they hold) and on the bundled default
prompts. Alternates the contenders in one sitting, 3 runs each, prints the median and the worst
run. The bundled model, CPU.

    .venv/bin/python scripts/spec_bench.py [--k 4] [--seqs 1 4 16 64] [--new 128] [--methods ngram draft_model]
"""

from __future__ import annotations

import argparse
import statistics
import time

from tinyllm import ContinuousEngine, EngineConfig, Request, load_checkpoint
from tinyllm.model.config import BUNDLED_DRAFT_NAME

FRIENDLY = [  # text the model is asked to continue, much of it in its prompt already
    "ROMEO:\nBut soft, what light through yonder window breaks? It is the east, and Juliet is the sun.\n",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo? Deny thy father and refuse thy name.\n",
    "HAMLET:\nTo be, or not to be, that is the question: whether 'tis nobler in the mind to suffer.\n",
    "KING:\nNow is the winter of our discontent made glorious summer by this sun of York.\n",
]
PLAIN = ["ROMEO:\n", "JULIET:\n", "First Citizen:\n", "MENENIUS:\n"]


def run(model, prompts: list[list[int]], seqs: int, new: int, k: int, method: str) -> tuple[float, float]:
    """(tok/s, acceptance) of one run: ``seqs`` requests at once (greedy, ignoring EOS)."""
    spec = {"num_speculative_tokens": k} if k else {}
    if k and method == "draft_model":
        spec["speculative_model"] = BUNDLED_DRAFT_NAME
    eng = ContinuousEngine(model, config=EngineConfig.best(max_num_seqs=seqs, **spec))
    for i in range(seqs):
        eng.add_request(Request(prompts[i % len(prompts)], new))
    t = time.perf_counter()
    while eng.has_work():
        eng.step()
    el = time.perf_counter() - t
    st = eng.stats
    return seqs * new / el, (st.spec_accepted_tokens / st.spec_draft_tokens if st.spec_draft_tokens else 0.0)


def main() -> None:
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--seqs", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--methods", nargs="+", default=["ngram", "draft_model"], choices=["ngram", "draft_model"])
    a = p.parse_args()
    model, tok = load_checkpoint(device="cpu")
    contenders = [("off", 0), *((m, a.k) for m in a.methods)]
    for name, texts in (("lookup-friendly", [t * 3 for t in FRIENDLY]), ("default prompts", PLAIN)):
        prompts = [tok.encode(t) for t in texts]
        for seqs in a.seqs:
            runs: dict[str, list[float]] = {c: [] for c, _ in contenders}
            acc: dict[str, float] = {}
            for _ in range(3):
                for method, k in contenders:  # alternated, in one sitting
                    tps, acc[method] = run(model, prompts, seqs, a.new, k, method)
                    runs[method].append(tps)
            off = statistics.median(runs["off"])
            line = f"{name:16} seqs {seqs:3}: without {off:7.0f} tok/s (worst {min(runs['off']):.0f})"
            for method, _ in contenders[1:]:
                on = runs[method]
                line += (
                    f" | {method} k={a.k} {statistics.median(on):7.0f} (worst {min(on):.0f}) "
                    f"{statistics.median(on) / off:.2f}x, kept {acc[method]:.0%}"
                )
            print(line, flush=True)


if __name__ == "__main__":
    main()
