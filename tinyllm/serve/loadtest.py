"""Overload, measured: ``python -m tinyllm.serve.loadtest`` (loopback only, bounded in clients,
requests and time).

It serves the bundled model in this process (``ServerThread`` on 127.0.0.1, any free port) with a
small waiting queue, then runs ``--clients`` clients at once, in a process of their own (by default 4x what the queue holds),
each sending ``--requests`` completions one after another: half of them streaming, one stream in
four hung up after its first chunk. Every request must either complete or be refused at once
with a 429 (and ``Retry-After``); afterwards nothing may wait or run, every KV block must be free,
and the process's RSS must be back within 10% of where it was after a warm-up. It prints the
outcomes, the refusals' latency, the admitted requests' TTFT (p50 / p99) and the RSS, and exits 1
if a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tinyllm.args import OneLineParser
from tinyllm.engine_args import add_engine_args


def rss_mib() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


async def one(c: httpx.AsyncClient, i: int, j: int, max_tokens: int, model: str) -> tuple[str, float, float | None]:
    """One request: (outcome, seconds to the answer's status, TTFT of an admitted stream)."""
    stream, hang_up = (i + j) % 2 == 0, (i + j) % 8 == 0
    body = {"model": model, "prompt": f"ROMEO {i}.{j}:", "max_tokens": max_tokens, "stream": stream}
    t0 = time.monotonic()
    async with c.stream("POST", "/v1/completions", json=body) as r:
        status_s = time.monotonic() - t0
        if r.status_code == 429:
            await r.aread()
            ok = "retry-after" in r.headers and r.json()["error"]["code"] == "max_waiting_exceeded"
            return ("refused" if ok else "bad refusal"), status_s, None
        if r.status_code != 200:
            await r.aread()
            return f"HTTP {r.status_code}", status_s, None
        if not stream:
            await r.aread()
            done = r.json()["usage"]["completion_tokens"] == max_tokens
            return ("completed" if done else "short"), status_s, None
        ttft, last = None, ""
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"text":""' not in line and ttft is None:
                ttft = time.monotonic() - t0
            if line:
                last = line
            if hang_up and ttft is not None:
                return "hung up", status_s, ttft
        return ("completed" if last == "data: [DONE]" else "cut"), status_s, ttft


async def run_clients(url: str, clients: int, requests: int, max_tokens: int, model: str, limit_s: float) -> list:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as c:
        deadline = time.monotonic() + limit_s

        async def client(i: int) -> list:
            out = []
            for j in range(requests):
                if time.monotonic() > deadline:
                    break
                out.append(await one(c, i, j, max_tokens, model))
            return out

        per = await asyncio.gather(*(client(i) for i in range(clients)))
    return [o for os_ in per for o in os_]


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m tinyllm.serve.loadtest", description=__doc__.split("\n\n")[0])
    add_engine_args(p, "slots", "threads", slots=4)  # a small server, so that a few dozen clients overload it
    p.add_argument("--max-waiting", type=int, default=8)
    p.add_argument("--clients", type=int, default=None, help="default: 4x (slots + max-waiting)")
    p.add_argument("--requests", type=int, default=6, help="per client, one after another")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--limit-s", type=float, default=120, help="no new request after this long")
    p.add_argument("--client-of", metavar="URL", help=argparse.SUPPRESS)  # the clients' process
    a = p.parse_args(argv)
    clients = a.clients or 4 * (a.slots + a.max_waiting)
    if a.client_of:  # the clients run in a process of their own: their GIL is not the server's
        print(json.dumps(asyncio.run(run_clients(a.client_of, clients, a.requests, a.max_tokens, "m", a.limit_s))))
        return 0

    import torch

    from tinyllm.model.checkpoint import load_checkpoint
    from tinyllm.serve import EngineLoop, Limits, ServerThread, build_engine, create_app

    torch.set_num_threads(a.threads)
    model, tok = load_checkpoint(device="cpu")
    app = create_app(EngineLoop(build_engine(model, slots=a.slots)), tok, "m", limits=Limits(max_waiting=a.max_waiting))
    with ServerThread(app) as s:
        asyncio.run(run_clients(s.url, a.slots, 2, a.max_tokens, "m", 30))  # warm-up
        gc.collect()
        rss0 = rss_mib()
        t0 = time.monotonic()
        child = [sys.executable, "-m", "tinyllm.serve.loadtest", "--client-of", s.url, "--clients", str(clients)]
        child += ["--requests", str(a.requests), "--max-tokens", str(a.max_tokens), "--limit-s", str(a.limit_s)]
        done = subprocess.run(child, capture_output=True, text=True, timeout=a.limit_s + 120, check=True)
        results = [tuple(r) for r in json.loads(done.stdout)]
        wall = time.monotonic() - t0
        deadline = time.monotonic() + 30
        while True:
            load, held = s.engine_loop.call(lambda e: (e.load(), e.slots.allocated_tokens()))
            if (load == (0, 0) and held == 0) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        gc.collect()
        rss1 = rss_mib()
    kinds = {k: sum(1 for r in results if r[0] == k) for k in sorted({r[0] for r in results})}
    refused = [st for k, st, _ in results if k == "refused"]
    ttfts = [t for k, _, t in results if t is not None and k in ("completed", "hung up")]
    print(
        f"{clients} clients x up to {a.requests} requests ({a.slots} slots, --max-waiting {a.max_waiting}, "
        f"{a.max_tokens} tokens each), {wall:.1f} s"
    )
    print(f"outcomes: {kinds}")
    print(
        f"refusals: {len(refused)}, answered in p50 {pct(refused, 0.5) * 1000:.0f} ms, p99 "
        f"{pct(refused, 0.99) * 1000:.0f} ms, max {max(refused, default=0) * 1000:.0f} ms"
    )
    print(
        f"admitted streams' TTFT: p50 {pct(ttfts, 0.5) * 1000:.0f} ms, p99 {pct(ttfts, 0.99) * 1000:.0f} ms "
        f"(mean {statistics.fmean(ttfts) * 1000 if ttfts else float('nan'):.0f} ms, {len(ttfts)} streams)"
    )
    print(f"after: waiting+running {load}, KV tokens held {held}; RSS {rss0:.0f} -> {rss1:.0f} MiB")
    bad = set(kinds) - {"completed", "hung up", "refused"}
    ok = not bad and load == (0, 0) and held == 0 and rss1 <= rss0 * 1.10
    print("ok" if ok else f"FAILED: {sorted(bad) or 'leak'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
