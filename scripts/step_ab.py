"""Engine steps A/B inside one process: the same engine steps each variant in turn, step after
step, so the machine's drift (±30% from minute to minute here) falls on every variant alike.

    python scripts/step_ab.py --model DIR|bundled --rows 64 --contexts ragged \
        --variants now,kernels@HEAD~1,off:rope_store

Variants: ``now`` is this tree as it is; ``kernels@REF`` is this tree's Python with the C kernels
of git REF (``tinyllm/csrc`` at REF, built beside today's); ``python@REF`` is this tree's kernels
with the Python functions and methods of git REF (each module of ``tinyllm/`` that differs: its
functions, and its classes' methods, swapped in for today's, so one engine runs either; a change
of data, not of code, is not swapped); ``off:NAME`` is this tree with
``native.NAME`` answering None, i.e. that kernel's PyTorch fallback (``off:A+B``: both), with the
layers run op by op (``model/c_layers.py`` off: a kernel switched off there is not called at all);
``off:layers`` is just that (each layer's kernels called from Python); ``torch`` is every kernel off;
``kv:DTYPE`` is this tree on an engine of its own whose K/V cache is DTYPE (``kv_cache_dtype``:
bfloat16, float32), the same requests as the others'.
Prints the median step (ms) per variant, and each against the first.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
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


class PythonAt:
    """The functions and methods of git ``ref``'s ``tinyllm/*.py`` where they differ from this
    tree's, ready to swap in (``on()``) and out (``off()``). Each old module is run under another
    name; in its functions' globals, today's changed modules' objects are replaced by the old ones
    (so old code calls old code), and old classes by today's (whose instances the engine holds).
    Functions gone since ``ref`` are put back while it is on. Not swapped: what an unchanged module
    imported by name from a changed one, methods only ``ref``'s classes had, and data (``ref``'s
    ``native.library()`` shares today's library). Meant for changes to the step's Python; not to be
    combined with ``torch`` or ``kernels@``."""

    def __init__(self, ref: str):
        import importlib
        import types
        root = Path(native.__file__).resolve().parents[1]
        changed = subprocess.run(["git", "diff", "--name-only", ref, "--", "tinyllm"], cwd=root, capture_output=True,
                                 text=True, check=True).stdout.split()
        self.swaps: list[tuple[object, str, object, object]] = []     # (owner, name, today's, old)
        olds, news = {}, {}
        for path in (p for p in changed if p.endswith(".py") and (root / p).exists()):
            name = path[:-3].replace("/", ".").removesuffix(".__init__")
            src = subprocess.run(["git", "show", f"{ref}:{path}"], cwd=root, capture_output=True, text=True)
            if src.returncode:
                continue                                     # new since ref
            old = sys.modules[f"_at_{ref}_{name}"] = types.ModuleType(f"_at_{ref}_{name}")   # (dataclasses look it up)
            old.__file__ = str(root / path)
            exec(compile(src.stdout, str(root / path), "exec"), old.__dict__)
            olds[name], news[name] = old, importlib.import_module(name)
        renamed = {}                                         # id(today's object) -> old, id(old class) -> today's
        for name, old in olds.items():
            new = news[name]
            for attr, obj in vars(old).items():
                now = vars(new).get(attr)
                if isinstance(obj, types.FunctionType) and getattr(obj, "__module__", None) == old.__name__:
                    if isinstance(now, types.FunctionType):
                        renamed[id(now)] = obj
                        self.swaps.append((new, attr, now, obj))
                    elif now is None:                        # gone since ref: there while ref's code runs
                        self.swaps.append((new, attr, None, obj))
                elif isinstance(obj, type) and obj.__module__ == old.__name__ and isinstance(now, type):
                    renamed[id(obj)] = now
                    for m, f in vars(obj).items():
                        if isinstance(f, (types.FunctionType, classmethod, staticmethod, property)) and m in vars(now):
                            self.swaps.append((now, m, vars(now)[m], f))
        for old in olds.values():
            for attr, obj in list(vars(old).items()):
                if id(obj) in renamed:
                    setattr(old, attr, renamed[id(obj)])

    def on(self) -> None:
        for owner, name, _, old in self.swaps:
            setattr(owner, name, old)

    def off(self) -> None:
        for owner, name, now, _ in self.swaps:
            if now is None:
                if name in vars(owner):
                    delattr(owner, name)
            else:
                setattr(owner, name, now)


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
    engines = {}                                         # one per K/V dtype (a kv:DTYPE variant: its own)
    for dtype in dict.fromkeys(v[3:] if v.startswith("kv:") else "auto" for v in a.variants):
        rng = random.Random(1)                           # the same requests in each
        eng = engines[dtype] = ContinuousEngine(model, a.rows, max_len=512, kv="paged", chunked_prefill=True,
                                                max_batched_tokens=max(a.rows * hi, 256), prefix_cache=False,
                                                kv_cache_dtype=dtype)
        for _ in range(a.rows):
            eng.add_request(Request([rng.randrange(1, model.cfg.vocab_size) for _ in range(rng.randint(lo, hi))],
                                    min(steps + 8, 512 - hi)))
        eng.step()
        eng.step()

    def engine(v: str) -> ContinuousEngine:
        return engines[v[3:] if v.startswith("kv:") else "auto"]

    times: dict[str, list[float]] = {v: [] for v in a.variants}
    for v in a.variants:                                 # one warm step each
        use(v)
        engine(v).step()
    for i in range(steps):
        v = a.variants[i % len(a.variants)]
        use(v)
        eng = engine(v)
        t = time.perf_counter()
        eng.step()
        times[v].append(time.perf_counter() - t)
    use(a.variants[0])
    for eng in engines.values():
        failed = [q for q in eng.snapshot().requests if q.state == "failed"]
        if failed or sum(eng.slots.active) < a.rows:       # (a variant that broke the engine times nothing)
            raise SystemExit(f"the engine stopped running its {a.rows} rows: "
                             f"{failed[0].error if failed else 'requests ended early'}")
    return {v: statistics.median(ts) * 1e3 for v, ts in times.items()}


def main() -> None:
    a = ab_arguments(__doc__, "now,torch", 40)
    current = native.library()
    plan = CLayers.__dict__["plan"]
    originals = {name: getattr(native, name) for name in dir(native) if callable(getattr(native, name))}
    libs, pythons = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for v in a.variants:
            if v.startswith("kernels@"):
                libs[v] = kernels_at(v.split("@", 1)[1], Path(tmp))
            elif v.startswith("python@"):
                pythons[v] = PythonAt(v.split("@", 1)[1])

    def use(v: str) -> None:
        for p in pythons.values():
            p.off()
        for name, f in originals.items():
            setattr(native, name, f)
        native._lib, native.ENABLED = libs.get(v, current), v != "torch"
        CLayers.plan = plan
        if v.startswith("off:"):
            CLayers.plan = classmethod(lambda cls, *args: None)
            for name in v[4:].split("+"):
                if name != "layers":
                    setattr(native, name, lambda *args, **kw: None)
        if v in pythons:
            pythons[v].on()

    med = alternate(a, use)
    base = med[a.variants[0]]
    print(a.model, a.rows, a.contexts, "  ".join(f"{v}: {m:.2f} ms ({m / base:.3f})" for v, m in med.items()))


if __name__ == "__main__":
    main()
