"""The app's own cost: the same workload headless and inside tinyllm-tui (driven headlessly).

    python -m tui.bench_app [--model DIR | --random-model SPEC] [--requests N] [--slots N] [--threads N]

Reports engine tokens/s in both (the app should keep >= 85% of headless) and key-press-to-screen
latency while the engine runs flat out: the time from a key press to the input showing the
character on a refreshed screen, p50/p95.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import torch
from textual import events

from tinyllm.bench import default_workload, random_checkpoint
from tinyllm.checkpoint import default_model_dir, load_checkpoint
from tinyllm.engine import ContinuousEngine, Sampling, percentile, run_continuous
from tui.app import TinyLLMApp
from tui.runner import SetPaused, Submit
from tui.screens import NextSettings


def headless_tok_s(model, reqs, slots: int) -> float:
    _, summary = run_continuous(model, reqs, slots)
    return summary["tok_s"]


async def in_app(model, tok, reqs, slots: int, keys: int) -> tuple[float, list[float]]:
    eng = ContinuousEngine(model, slots)
    app = TinyLLMApp(eng, tok, model_name="bench", paused=True,
                     settings=NextSettings(Sampling(), 8))
    async with app.run_test(size=(160, 48)) as pilot:
        for r in reqs:
            app.runner.send(Submit(tok.decode(r.prompt), r.max_new_tokens, Sampling(), False, tuple(r.prompt)))
        while len(app.runner.frame.snapshot.requests) < len(reqs):
            await pilot.pause(0.01)
        total = sum(r.max_new_tokens for r in reqs)
        t0 = time.perf_counter()
        app.runner.send(SetPaused(False))
        inp = app.query_one("#prompt")
        inp.focus()
        lat: list[float] = []
        while app.runner.frame.snapshot.counters.finished < len(reqs):
            if len(lat) < keys:
                before = inp.value
                t = time.perf_counter()
                app.post_message(events.Key("a", "a"))   # as the terminal driver delivers a key
                while inp.value == before:
                    await asyncio.sleep(0.0005)
                painted = asyncio.Event()
                app.call_after_refresh(painted.set)      # runs once the screen has been redrawn
                await painted.wait()
                lat.append(time.perf_counter() - t)
                await asyncio.sleep(0.05)
            else:
                await asyncio.sleep(0.02)
        wall = time.perf_counter() - t0
        done = app.runner.frame.snapshot.counters.useful_tokens
        assert done == total, (done, total)
    return total / wall, lat


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tui.bench_app", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", metavar="DIR")
    p.add_argument("--random-model", nargs="?", const="", metavar="SPEC")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--keys", type=int, default=40, help="key presses to time")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    tmp = None
    if a.random_model is not None:
        tmp = tempfile.TemporaryDirectory()
        path = random_checkpoint(a.random_model, Path(tmp.name) / "m")
    else:
        path = Path(a.model) if a.model else default_model_dir()
    model, tok = load_checkpoint(path)
    reqs = default_workload(a.requests, model.cfg.vocab_size)
    headless_tok_s(model, reqs[:4], a.slots)                      # warm-up
    head = headless_tok_s(model, reqs, a.slots)
    app_tps, lat = asyncio.run(in_app(model, tok, reqs, a.slots, a.keys))
    lat.sort()
    print(f"model: {path if a.model or a.random_model is None else 'random ' + (a.random_model or 'default')}; "
          f"{a.requests} requests, {a.slots} slots, {a.threads} torch threads")
    print(f"engine tokens/s headless: {head:.0f}")
    print(f"engine tokens/s inside tinyllm-tui: {app_tps:.0f} ({app_tps / head:.0%} of headless)")
    print(f"key-press-to-screen latency while running flat out: p50 {percentile(lat, .5) * 1e3:.1f} ms, "
          f"p95 {percentile(lat, .95) * 1e3:.1f} ms over {len(lat)} presses")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
