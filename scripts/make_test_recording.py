#!/usr/bin/env python
"""Regenerate tests/data/preemption-run.jsonl, the recording the replay tests and SVG snapshots use.

The bundled model, 3 shared-prefix prompts + 3 from prompts/preemption.jsonl, 40 new tokens each,
greedy; 3 slots of 256 tokens over a pool of 16 blocks of 16 tokens (so it preempts), chunked
prefill with a 32-token budget and the prefix cache (so it chunks and hits); #5 aborted at step 30.
Run from the repo root: .venv/bin/python scripts/make_test_recording.py (the snapshots then change).
It steps the run with the tests' own driver (tests/helpers.py: run_to_the_end)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root: tests.helpers

from tests.helpers import run_to_the_end
from tinyllm.engine import ContinuousEngine, Sampling
from tinyllm.model.checkpoint import load_checkpoint
from tinyllm.request import RequestSettings
from tinyllm.workload import load_workload, resolve_workload
from tui.runners.engine import EngineRunner
from tui.runners.frames import FrameRecorder

model, tok = load_checkpoint()
eng = ContinuousEngine(
    model,
    3,
    256,
    kv="paged",
    block_size=16,
    kv_blocks=16,
    chunked_prefill=True,
    max_batched_tokens=32,
    generator=torch.Generator().manual_seed(0),
)
rec = FrameRecorder(
    "tests/data/preemption-run.jsonl",
    eng.snapshot(),
    "shakespeare",
    "tinyllm/data/shakespeare",
    {"slots": 3, "kv": "paged", "block_size": 16, "kv_blocks": 16, "chunked_prefill": True, "max_batched_tokens": 32},
)
r = EngineRunner(eng, tok, paused=True, recorder=rec)
items = load_workload(resolve_workload("shared_prefix"))[:3] + load_workload(resolve_workload("preemption"))[:3]
for it in items:
    r._submit(it.prompt, None, RequestSettings(Sampling(), 40, True))
frame = run_to_the_end(r, aborts={30: 5})
print(eng.steps, eng.snapshot().counters)
print([e.text for e in frame.log if e.kind == "error"])
