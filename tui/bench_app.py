"""The app's own cost: the same workload headless and inside tinyllm-tui (driven headlessly).

    python -m tui.bench_app [--model DIR | --random-model SPEC] [--requests N] [--slots N]
                            [--threads N] [--runner process|thread|both] [--repeat N]

Reports engine tokens/s headless and inside the app (the app should keep >= 85% of headless),
for the engine in its own process (the app's default) and in a thread of the app's process
(``--engine-thread``), and key-press-to-screen latency while the engine runs flat out: the time
from a key press to the input showing the character on a refreshed screen, p50/p95. Each app
run is paired with a headless run just before it, as this kind of machine drifts by ±15%.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import torch
from textual import events

from tinyllm.bench import default_workload, random_checkpoint
from tinyllm.checkpoint import default_model_dir, load_checkpoint
from tinyllm.engine import ContinuousEngine, Sampling, percentile, run_continuous
from tui.app import TinyLLMApp
from tui.process_runner import EngineSpec, ProcessRunner
from tui.runner import EngineRunner, SetPaused, Submit
from tui.screens import NextSettings


def headless_tok_s(model, reqs, slots: int) -> float:
    _, summary = run_continuous(model, reqs, slots)
    return summary["tok_s"]


async def in_app(runner, tok, reqs, keys: int) -> tuple[float, list[float], float]:
    app = TinyLLMApp(runner, tok, model_name="bench", settings=NextSettings(Sampling(), 8))
    async with app.run_test(size=(160, 48)) as pilot:
        def submit(batch) -> None:
            for r in batch:
                app.runner.send(Submit(tok.decode(r.prompt), r.max_new_tokens, Sampling(), False, tuple(r.prompt)))

        warm = reqs[:4]                                   # as headless_tok_s warms up: same shapes first
        submit(warm)
        app.runner.send(SetPaused(False))
        while app.runner.frame.snapshot.counters.finished < len(warm):
            await pilot.pause(0.01)
        app.runner.send(SetPaused(True))
        submit(reqs)
        while len(app.runner.frame.snapshot.requests) < len(warm) + len(reqs) or not app.runner.frame.paused:
            await pilot.pause(0.01)
        base = app.runner.frame.snapshot.counters.useful_tokens
        total = sum(r.max_new_tokens for r in reqs)
        t0 = time.perf_counter()
        app.runner.send(SetPaused(False))
        inp = app.query_one("#prompt")
        inp.focus()
        changed = asyncio.Event()
        app.watch(inp, "value", lambda _: changed.set(), init=False)    # no polling: it would cost CPU
        lat: list[float] = []
        while app.runner.frame.snapshot.counters.finished < len(warm) + len(reqs):
            if len(lat) < keys:
                changed.clear()
                t = time.perf_counter()
                app.post_message(events.Key("a", "a"))   # as the terminal driver delivers a key
                await changed.wait()
                painted = asyncio.Event()
                app.call_after_refresh(painted.set)      # runs once the screen has been redrawn
                await painted.wait()
                lat.append(time.perf_counter() - t)
                await asyncio.sleep(0.05)
            else:
                await asyncio.sleep(0.02)
        wall = time.perf_counter() - t0
        done = app.runner.frame.snapshot.counters.useful_tokens - base
        assert done == total, (done, total)
        hz = app.frames_drawn / wall
    return total / wall, lat, hz


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tui.bench_app", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", metavar="DIR")
    p.add_argument("--random-model", nargs="?", const="", metavar="SPEC")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--keys", type=int, default=40, help="key presses to time per app run")
    p.add_argument("--runner", choices=["process", "thread", "both"], default="both")
    p.add_argument("--repeat", type=int, default=2, help="headless/app pairs per runner")
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
    spec = EngineSpec(str(path), "cpu", a.slots, threads=a.threads)
    print(f"model: {path if a.model or a.random_model is None else 'random ' + (a.random_model or 'default')}; "
          f"{a.requests} requests, {a.slots} slots, {a.threads} torch threads")
    for kind in (["process", "thread"] if a.runner == "both" else [a.runner]):
        ratios, tps, lat, rates = [], [], [], []
        for _ in range(a.repeat):
            head = headless_tok_s(model, reqs, a.slots)
            if kind == "process":
                runner = ProcessRunner(spec, paused=True).start()
            else:
                runner = EngineRunner(ContinuousEngine(model, a.slots), tok, paused=True)
            app_tps, keys, hz = asyncio.run(in_app(runner, tok, reqs, a.keys))
            rates.append(hz)
            ratios.append(app_tps / head)
            tps.append((head, app_tps))
            lat += keys
        lat.sort()
        pairs = ", ".join(f"{h:.0f} → {t:.0f}" for h, t in tps)
        print(f"engine in a {kind}: tokens/s headless → in app: {pairs}; "
              f"median {statistics.median(ratios):.0%} of headless; the app drew {statistics.mean(rates):.0f} frames/s")
        print(f"  key-press-to-screen latency while running flat out: p50 {percentile(lat, .5) * 1e3:.1f} ms, "
              f"p95 {percentile(lat, .95) * 1e3:.1f} ms over {len(lat)} presses")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
