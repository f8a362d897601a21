"""The app's own cost: the same workload headless and inside tinyllm-tui (driven headlessly).

    python -m tui.bench_app [--model DIR | --random-model SPEC] [--requests N] [--slots N]
                            [--threads N] [--runner process|thread|both] [--repeat N]
                            [--keys N] [--key-gap S] [--layout list|panes|both]

Reports engine tokens/s headless and inside the app (the app should keep >= 85% of headless),
for the engine in its own process (the app's default) and in a thread of the app's process
(``--engine-thread``). The app is measured twice: watching (the screen updating, no input) and
while someone types into the prompt (a key every ``--key-gap`` s), which also gives the
key-press-to-screen latency while the engine runs flat out: the time from a key press to the
input showing the character on a refreshed screen, p50/p95. Each repeat runs headless just
before its two app runs, as this kind of machine drifts by ±15% from minute to minute.
``--layout panes`` measures the app in its panes view (every slot's request writing at once:
``tinyllm-tui --panes``), ``both`` each layout in turn, after the same headless run.
"""

from __future__ import annotations

import asyncio
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch
from textual import events

from tinyllm.args import OneLineParser
from tinyllm.bench import default_workload, random_checkpoint
from tinyllm.config import ONE_THREAD, EngineConfig
from tinyllm.engine import ContinuousEngine, Sampling, percentile, run_continuous
from tinyllm.engine_args import add_engine_args, fill_engine_defaults
from tinyllm.model.checkpoint import default_model_dir, load_checkpoint
from tinyllm.request import RequestSettings
from tui.app import TinyLLMApp
from tui.runners.child import ChildRunner
from tui.runners.engine import EngineRunner
from tui.runners.engine_spec import EngineSpec
from tui.runners.interface import SetPaused, Submit

SCHEDULERS = {
    "slots": dict(kv="slots"),
    "paged": dict(kv="paged"),
    "chunked": dict(kv="paged", chunked_prefill=True),
}  # chunked: the app's default


def headless_tok_s(model, reqs, slots: int, scheduler: str = "chunked") -> float:
    _, summary = run_continuous(model, reqs, slots, **SCHEDULERS[scheduler])
    return summary["tok_s"]


def _process_cpu() -> float:
    """CPU seconds of this process (the app: every thread), not of the engine's child."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def in_app(
    runner, tok, reqs, keys: int, key_gap: float, panes: bool = False
) -> tuple[float, list[float], float, float]:
    app = TinyLLMApp(runner, tok, model_name="bench", settings=RequestSettings(Sampling(), 8), panes=panes)
    async with app.run_test(size=(160, 48)) as pilot:

        def submit(batch) -> None:
            for r in batch:
                app.runner.send(
                    Submit(tok.decode(r.prompt), RequestSettings(Sampling(), r.max_new_tokens, False), tuple(r.prompt))
                )

        warm = reqs[:4]  # as headless_tok_s warms up: same shapes first
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
        t0, cpu0 = time.perf_counter(), _process_cpu()
        app.runner.send(SetPaused(False))
        inp = app.query_one("#prompt")
        inp.focus()
        changed = asyncio.Event()
        app.watch(inp, "value", lambda _: changed.set(), init=False)  # no polling: it would cost CPU
        lat: list[float] = []
        while app.runner.frame.snapshot.counters.finished < len(warm) + len(reqs):
            if len(lat) < keys:
                changed.clear()
                t = time.perf_counter()
                app.post_message(events.Key("a", "a"))  # as the terminal driver delivers a key
                await changed.wait()
                painted = asyncio.Event()
                app.call_after_refresh(painted.set)  # runs once the screen has been redrawn
                await painted.wait()
                lat.append(time.perf_counter() - t)
                await asyncio.sleep(max(0.0, key_gap - (time.perf_counter() - t)))
            else:
                await asyncio.sleep(0.02)
        wall = time.perf_counter() - t0
        done = app.runner.frame.snapshot.counters.useful_tokens - base
        assert done == total, (done, total)
        hz = app.frames_drawn / wall
        ui_share = (_process_cpu() - cpu0) / wall
    return total / wall, lat, hz, ui_share


def report(kind: str, layout: str, rows: list, lat: list[float], key_gap: float) -> None:
    """One runner and layout's lines: tokens/s against headless, frames drawn, key latency."""
    print(
        f"engine in a {kind}, the app's {layout} view: tokens/s headless → app watching → app while typing: "
        + ", ".join(f"{h:.0f} → {w[0]:.0f} → {t[0]:.0f}" for h, w, t in rows)
    )
    for label, i in (("watching", 1), ("typing", 2)):
        kept = statistics.median(r[i][0] / r[0] for r in rows)
        print(
            f"  {label}: median {kept:.0%} of headless; the app drew "
            f"{statistics.mean(r[i][1] for r in rows):.0f} frames/s using "
            f"{statistics.mean(r[i][2] for r in rows):.0%} of a core"
            + (" (engine included)" if kind == "thread" else "")
        )
    print(
        f"  key-press-to-screen latency while running flat out: p50 {percentile(lat, 0.5) * 1e3:.1f} ms, "
        f"p95 {percentile(lat, 0.95) * 1e3:.1f} ms over {len(lat)} presses, one every {key_gap * 1e3:.0f} ms"
    )


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(prog="python -m tui.bench_app", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", metavar="DIR")
    p.add_argument("--random-model", nargs="?", const="", metavar="SPEC")
    p.add_argument("--requests", type=int, default=64)
    add_engine_args(p, "slots", "threads", threads=ONE_THREAD)  # (threads: as the app)
    p.add_argument(
        "--scheduler",
        choices=sorted(SCHEDULERS),
        default="chunked",
        help="slot KV, paged KV, or paged KV with chunked prefill (default, as the app)",
    )
    p.add_argument("--keys", type=int, default=40, help="key presses to time in the typing run")
    p.add_argument(
        "--key-gap",
        type=float,
        default=0.15,
        metavar="S",
        help="seconds between key presses (default 0.15: a fast typist)",
    )
    p.add_argument("--runner", choices=["process", "thread", "both"], default="both")
    p.add_argument(
        "--layout",
        choices=["list", "panes", "both"],
        default="list",
        help="the app's layout: the list view (default), the panes view, or each in turn",
    )
    p.add_argument("--repeat", type=int, default=2, help="headless/app pairs per runner")
    a = fill_engine_defaults(p.parse_args(argv))
    torch.set_num_threads(a.threads)
    tmp = None
    if a.random_model is not None:
        tmp = tempfile.TemporaryDirectory()
        path = random_checkpoint(a.random_model, Path(tmp.name) / "m")
    else:
        path = Path(a.model) if a.model else default_model_dir()
    model, tok = load_checkpoint(path)
    reqs = default_workload(a.requests, model.cfg.vocab_size)
    headless_tok_s(model, reqs[:4], a.slots, a.scheduler)  # warm-up
    sched = SCHEDULERS[a.scheduler]
    config = EngineConfig(
        device="cpu",
        max_num_seqs=a.slots,
        threads=a.threads,
        kv=sched["kv"],
        chunked_prefill=sched.get("chunked_prefill", False),
    )
    spec = EngineSpec(str(path), config)
    print(
        f"model: {path if a.model or a.random_model is None else 'random ' + (a.random_model or 'default')}; "
        f"{a.requests} requests, {a.slots} slots, {a.scheduler} scheduler, {a.threads} torch threads"
    )
    layouts = ["list", "panes"] if a.layout == "both" else [a.layout]
    for kind in ["process", "thread"] if a.runner == "both" else [a.runner]:
        rows: dict[str, list] = {layout: [] for layout in layouts}
        lat: dict[str, list[float]] = {layout: [] for layout in layouts}
        for _ in range(a.repeat):
            head = headless_tok_s(model, reqs, a.slots, a.scheduler)
            for layout in layouts:
                runs = []
                for keys in (0, a.keys):  # watching, then typing
                    if kind == "process":
                        runner = ChildRunner(spec, paused=True).start()
                    else:
                        runner = EngineRunner(ContinuousEngine(model, a.slots, **sched), tok, paused=True)
                    tps, key_lat, hz, share = asyncio.run(
                        in_app(runner, tok, reqs, keys, a.key_gap, panes=layout == "panes")
                    )
                    runs.append((tps, hz, share))
                    lat[layout] += key_lat
                rows[layout].append((head, *runs))
        for layout in layouts:
            report(kind, layout, rows[layout], sorted(lat[layout]), a.key_gap)
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
