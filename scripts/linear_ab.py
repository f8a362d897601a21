"""The linear layers on the C kernel (csrc/linear.c) against oneDNN's packed weights (what runs
without a compiler, and what ran before), in one process, alternating:

    python scripts/linear_ab.py --model DIR|bundled --rows 1 8 64 [--matmul-only 1 8 64 256]

Engine steps (``--rows``): step_ab.py's decoding engine steps each variant in turn; prints the
median step per variant. ``--matmul-only``: every Linear of the model on its own at M rows (the
weights stream from memory as in a step, 44 MB on the bundled model), the two backends
alternating, median of 5 each. docs/speed.md ("Fifth pass") reads these.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from step_ab import alternate
from torch import Tensor

from tinyllm.bench.anatomy import matmul_only_s
from tinyllm.model import linear
from tinyllm.model.checkpoint import load_checkpoint

BACKEND = {"now": "c"}
_c_forward = linear.Linear.forward


def _forward(self: linear.Linear, x: Tensor, add: Tensor | None = None) -> Tensor:
    """Linear.forward, or the same layer on its own oneDNN-packed copy (kept beside the C one, so
    switching costs no repacking inside a timed step)."""
    if BACKEND["now"] == "c" or torch.is_grad_enabled():
        return _c_forward(self, x, add)
    if getattr(self, "_onednn_of", None) != self.weight.data_ptr():
        self._onednn, self._onednn_of = linear.onednn_pack(self.weight), self.weight.data_ptr()
    return linear.onednn_linear(x, self._onednn, add)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="bundled")
    p.add_argument("--rows", type=int, nargs="*", default=[1, 8, 64])
    p.add_argument("--contexts", default="ragged")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--matmul-only", type=int, nargs="*", default=[])
    a = p.parse_args()
    torch.set_num_threads(2)
    if not linear._ONEDNN:
        raise SystemExit("this torch has no oneDNN: nothing to compare against")
    linear.Linear.forward = _forward
    use = BACKEND.__setitem__
    for rows in a.rows:
        med = alternate(argparse.Namespace(model=a.model, rows=rows, contexts=a.contexts, steps=a.steps,
                                           variants=["c", "onednn"]), lambda v: use("now", v))
        print(f"{a.model} {rows} rows: step C {med['c']:.2f} ms, oneDNN {med['onednn']:.2f} ms "
              f"-> oneDNN / C = {med['onednn'] / med['c']:.3f}")
    if a.matmul_only:
        model, _ = load_checkpoint(None if a.model == "bundled" else a.model)
        with torch.no_grad():
            for m in a.matmul_only:
                times = {"c": [], "onednn": []}
                for _ in range(5):
                    for v in times:
                        use("now", v)
                        times[v].append(matmul_only_s(model, m, n=20))
                c, d = statistics.median(times["c"]), statistics.median(times["onednn"])
                print(f"{a.model} matmul-only at {m} rows: C {c * 1e3:.2f} ms, oneDNN {d * 1e3:.2f} ms "
                      f"-> {d / c:.2f}x")


if __name__ == "__main__":
    main()
