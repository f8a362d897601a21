"""Regenerate docs/screenshot.svg: the app mid-run on a tight paged cache, the token-budget
scheduler prefilling long prompts in chunks while others decode and get preempted.

    .venv/bin/python scripts/screenshot.py [WIDTH HEIGHT]
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import torch

from tinyllm.engine import ContinuousEngine, Sampling
from tinyllm.model.checkpoint import load_checkpoint
from tinyllm.request import RequestSettings
from tinyllm.workload import bundled_workloads
from tui.app import TinyLLMApp
from tui.runners.engine import EngineRunner
from tui.runners.interface import StepOnce


def demo_app(panes: bool = False) -> TinyLLMApp:
    """The app the docs' pictures show: the bundled model on a tight paged pool (6 slots, 40
    blocks of 16, 24 tokens a step), paused, loading the mixed_lengths workload."""
    model, tok = load_checkpoint()
    eng = ContinuousEngine(
        model,
        6,
        512,
        kv="paged",
        block_size=16,
        kv_blocks=40,
        generator=torch.Generator().manual_seed(0),
        chunked_prefill=True,
        max_batched_tokens=24,
    )
    return TinyLLMApp(
        EngineRunner(eng, tok, paused=True),
        tok,
        model_name="bundled Shakespeare",
        settings=RequestSettings(Sampling(0.8, top_k=50), 120),
        prompts_file=bundled_workloads()["mixed_lengths"],
        panes=panes,
    )


async def wait_for_requests(app: TinyLLMApp, pilot, n: int = 16) -> None:
    """Until the workload's first ``n`` requests are in."""
    while len(app.runner.frame.snapshot.requests) < n:
        await pilot.pause(0.05)


async def step_once(app: TinyLLMApp, pilot) -> None:
    """One engine step, waited for."""
    n = app.runner.steps_done
    app.runner.send(StepOnce())
    while app.runner.steps_done == n:
        await pilot.pause(0.01)


async def main(width: int, height: int, out: Path) -> None:
    app = demo_app()
    async with app.run_test(size=(width, height)) as pilot:
        await wait_for_requests(app, pilot)
        for _ in range(120):
            await step_once(app, pilot)
        running = [r for r in app.runner.frame.snapshot.requests if r.state == "running"]
        app.select(max(running, key=lambda r: len(r.tokens)).rid if running else 0)
        app.query_one("#requests").focus()
        await pilot.pause(0.3)
        app.refresh_from_runner(force=True)
        await pilot.pause(0.3)
        app.save_screenshot(str(out.name), str(out.parent))
    print(f"wrote {out}")


if __name__ == "__main__":
    w, h = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) == 3 else (160, 48)
    asyncio.run(main(w, h, Path("docs/screenshot.svg")))
