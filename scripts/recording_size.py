#!/usr/bin/env python
"""How big a --record file gets: N requests through the bundled model, recorded step by step.

    .venv/bin/python scripts/recording_size.py [REQUESTS] [NEW_TOKENS]    (default 500 x 160)

Prints steps, records, bytes (plain and gzip) and bytes per step. 8 slots, paged KV, chunked
prefill with the prefix cache (the app's defaults), sampled at T=0.8 from prompts/*.jsonl."""

from __future__ import annotations

import gzip
import sys
import tempfile
import time
from pathlib import Path

import torch

from tinyllm.engine import ContinuousEngine, Sampling
from tinyllm.model.checkpoint import load_checkpoint
from tinyllm.request import RequestSettings
from tinyllm.workload import bundled_workloads, load_workload
from tui.runners.engine import EngineRunner
from tui.runners.frames import FrameRecorder
from tui.runners.interface import StepOnce


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    new = int(sys.argv[2]) if len(sys.argv) > 2 else 160
    torch.set_num_threads(1)
    model, tok = load_checkpoint()
    prompts = [it.prompt for p in sorted(bundled_workloads().values()) for it in load_workload(p)]
    eng = ContinuousEngine(model, 8, 512, kv="paged", chunked_prefill=True, generator=torch.Generator().manual_seed(0))
    out = Path(tempfile.mkdtemp()) / "run.jsonl"
    runner = EngineRunner(eng, tok, paused=True, recorder=FrameRecorder(out, eng.snapshot(), "shakespeare", "", {}))
    for i in range(n):
        runner._submit(prompts[i % len(prompts)], None, RequestSettings(Sampling(0.8), new, False))
    t = time.perf_counter()
    while eng.has_work():
        runner._apply(StepOnce())
        runner._publish()
    runner.stop()
    runner.run()
    size = out.stat().st_size
    packed = len(gzip.compress(out.read_bytes()))
    lines = sum(1 for _ in out.open())
    print(
        f"{n} requests x {new} new tokens: {eng.steps} steps, {lines - 1} records in {time.perf_counter() - t:.0f} s; "
        f"{size / 2**20:.2f} MiB ({size / eng.steps:.0f} B/step), gzip {packed / 2**20:.2f} MiB"
    )


if __name__ == "__main__":
    main()
