"""Engine steps A/B inside one process: the same engine steps each variant in turn, step after
step, so the machine's drift (±30% from minute to minute here) falls on every variant alike.

    python scripts/step_ab.py --model DIR|bundled --rows 64 --contexts ragged \
        --variants now,kernels@HEAD~1,off:rope_store

Variants: ``now`` is this tree as it is; ``kernels@REF`` is this tree's Python with the C kernels
of git REF (``tinyllm/csrc`` at REF, built beside today's); ``off:NAME`` is this tree with
``native.NAME`` answering None, i.e. that kernel's PyTorch fallback (``off:A+B``: both), with the
layers run op by op (``model/c_layers.py`` off: a kernel switched off there is not called at all);
``off:layers`` is just that (each layer's kernels called from Python); ``torch`` is every kernel off.
Prints the median step (ms) per variant, and each against the first.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Callable

import torch

from tinyllm import native
from tinyllm.model.c_layers import CLayers
from tinyllm.engine import ContinuousEngine, Request
from tinyllm.model.checkpoint import load_checkpoint

CONTEXTS = {"uniform": (96, 96), "ragged": (8, 192), "long": (100, 380)}


def kernels_at(ref: str, into: Path):
    """The C kernels of git ``ref``, built and loaded (another copy of the library, by path)."""
    root = Path(native.__file__).resolve().parents[1]
    tar = subprocess.run(["git", "archive", ref, "tinyllm/csrc"], cwd=root, capture_output=True, check=True).stdout
    dest = into / ref.replace("/", "_")
    tarfile.open(fileobj=BytesIO(tar)).extractall(dest, filter="data")
    try:
        return native.load(native._build(native._compiler(), dest / "tinyllm" / "csrc"))
    except AttributeError as e:                  # a ref from before a kernel this tree calls
        raise SystemExit(f"kernels@{ref}: that tree's kernels lack one this tree calls ({e})") from None


def ab_arguments(doc: str, variants: str, steps: int) -> argparse.Namespace:
    """The options every in-process A/B takes (this script's and scripts/attention_ab.py's)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--model", default="bundled")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--contexts", choices=sorted(CONTEXTS), default="ragged")
    p.add_argument("--variants", default=variants)
    p.add_argument("--steps", type=int, default=steps, help="steps per variant")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    a.variants = a.variants.split(",")
    return a


def alternate(a: argparse.Namespace, use: Callable[[str], None]) -> dict[str, float]:
    """An engine with ``a.rows`` sequences decoding (contexts drawn from ``a.contexts``) steps each
    variant in turn (``use(v)`` switches to it), ``a.steps`` times each after a warm step; returns
    the median step (ms) per variant, and leaves the first variant on."""
    model, _ = load_checkpoint(None if a.model == "bundled" else a.model)
    steps = a.steps * len(a.variants)
    lo, hi = CONTEXTS[a.contexts]
    rng = random.Random(1)
    eng = ContinuousEngine(model, a.rows, max_len=512, kv="paged", chunked_prefill=True,
                           max_batched_tokens=max(a.rows * hi, 256), prefix_cache=False)
    for _ in range(a.rows):
        eng.add_request(Request([rng.randrange(1, model.cfg.vocab_size) for _ in range(rng.randint(lo, hi))],
                                min(steps + 8, 512 - hi)))
    eng.step()
    eng.step()
    times: dict[str, list[float]] = {v: [] for v in a.variants}
    for v in a.variants:                                 # one warm step each
        use(v)
        eng.step()
    for i in range(steps):
        v = a.variants[i % len(a.variants)]
        use(v)
        t = time.perf_counter()
        eng.step()
        times[v].append(time.perf_counter() - t)
    use(a.variants[0])
    return {v: statistics.median(ts) * 1e3 for v, ts in times.items()}


def main() -> None:
    a = ab_arguments(__doc__, "now,torch", 40)
    current = native.library()
    plan = CLayers.__dict__["plan"]
    originals = {name: getattr(native, name) for name in dir(native) if callable(getattr(native, name))}
    libs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for v in a.variants:
            if v.startswith("kernels@"):
                libs[v] = kernels_at(v.split("@", 1)[1], Path(tmp))

    def use(v: str) -> None:
        for name, f in originals.items():
            setattr(native, name, f)
        native._lib, native.ENABLED = libs.get(v, current), v != "torch"
        CLayers.plan = plan
        if v.startswith("off:"):
            CLayers.plan = classmethod(lambda cls, *args: None)
            for name in v[4:].split("+"):
                if name != "layers":
                    setattr(native, name, lambda *args, **kw: None)

    med = alternate(a, use)
    base = med[a.variants[0]]
    print(a.model, a.rows, a.contexts, "  ".join(f"{v}: {m:.2f} ms ({m / base:.3f})" for v, m in med.items()))


if __name__ == "__main__":
    main()
