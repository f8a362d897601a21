"""The first engine of a process freezes the heap it starts with (tinyllm/engine/heap.py), so no
full garbage collection walks PyTorch's ~170k objects in the middle of a run."""

from __future__ import annotations

import subprocess
import sys

from tinyllm.engine import ContinuousEngine, heap
from tinyllm.engine.static import StaticBatcher

SCRIPT = """
import gc
from tests.helpers import random_model
from tinyllm.engine import ContinuousEngine
model = random_model()
assert gc.get_freeze_count() == 0, gc.get_freeze_count()
ContinuousEngine(model, 2, kv="paged")
print(gc.get_freeze_count())
"""


def test_an_engine_freezes_what_the_process_holds():
    """In a fresh interpreter (this one may have frozen already): nothing frozen before the first
    engine, then everything alive (PyTorch's modules, the model: tens of thousands of objects)."""
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) > 10_000


def test_each_kind_of_engine_freezes_once_per_process(model, monkeypatch):
    """Static and continuous engines both freeze at construction; a later engine does not collect
    or freeze again."""
    calls = []
    monkeypatch.setattr(heap.gc, "collect", lambda: calls.append("collect"))
    monkeypatch.setattr(heap.gc, "freeze", lambda: calls.append("freeze"))
    for make in (lambda: StaticBatcher(model, 2), lambda: ContinuousEngine(model, 2, kv="paged")):
        monkeypatch.setattr(heap, "_frozen", False)
        calls.clear()
        make()
        make()
        assert calls == ["collect", "freeze"]
