"""The race's finish line next to tinyllm bench's paths on the same workload, in one process.

    python scripts/race_vs_bench.py [--workload mixed_lengths] [--slots 8] [--threads 1] [--rounds 3]

Each round runs the bench's three paths (run_static, run_continuous with slots, run_continuous
paged + chunked prefill + prefix cache: what `tinyllm bench` times) and then the race (one
process, lanes taking turns, each on its own clock), so changes in machine load hit both alike.
Prints every round and the medians. Greedy, no end-of-text, 64 new tokens where a line gives none,
context 512: the bench's settings and the race's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tinyllm.bench import warm_up  # noqa: E402
from tinyllm.model.checkpoint import load_checkpoint  # noqa: E402
from tinyllm.engine import Request, run_continuous, run_static  # noqa: E402
from tinyllm.race.race import build_race  # noqa: E402
from tinyllm.workload import resolve_workload  # noqa: E402
from tinyllm.race.rules import DEFAULT_MAX_LEN  # noqa: E402
from tui.runners.race import race_workload  # noqa: E402

COLS = ("tok_s", "ttft_p50_s", "ttft_p95_s", "latency_p95_s", "row_util", "kv_used_mean", "decode_steps")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="mixed_lengths")
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model, tok = load_checkpoint()
    work = race_workload(resolve_workload(a.workload), tok.encode, DEFAULT_MAX_LEN)
    reqs = [Request(list(ids), new) for _, ids, new, _, _ in work]
    warm_up(model, None, "cpu")
    paths = {
        "static": lambda: run_static(model, reqs, a.slots)[1],
        "continuous": lambda: run_continuous(model, reqs, a.slots, max_len=DEFAULT_MAX_LEN)[1],
        "chunked": lambda: run_continuous(model, reqs, a.slots, max_len=DEFAULT_MAX_LEN, kv="paged",
                                          chunked_prefill=True)[1],
    }
    runs: dict[tuple[str, str], list[dict]] = {}
    for r in range(a.rounds):
        for key, run in paths.items():
            runs.setdefault(("bench", key), []).append(run())
        t = time.perf_counter()
        race = build_race(model, [(t0, Request(list(ids), new)) for t0, ids, new, _, _ in work], a.slots, DEFAULT_MAX_LEN)
        while race.step() is not None:
            pass
        for lane in race.lanes:
            res = lane.result()
            runs.setdefault(("race", lane.key), []).append(
                {"tok_s": res.tok_s, "ttft_p50_s": res.ttft_p50_s, "ttft_p95_s": res.ttft_p95_s,
                 "latency_p95_s": res.latency_p95_s, "row_util": res.row_util, "kv_used_mean": res.kv_used_mean,
                 "decode_steps": res.decode_steps})
        print(f"round {r + 1}: " + "  ".join(f"{src} {key} {runs[(src, key)][-1]['tok_s']:.0f}"
                                            for src, key in runs) + f"  (race wall {time.perf_counter() - t:.1f} s)")
    print(f"\n{a.workload}, {a.slots} slots / batch {a.slots}, {a.threads} torch thread(s), median of {a.rounds} rounds")
    print(f"{'':18}" + "".join(f"{c:>15}" for c in COLS))
    for key in paths:
        for src in ("race", "bench"):
            med = {c: statistics.median(x[c] for x in runs[(src, key)]) for c in COLS}
            print(f"{src + ' ' + key:18}" + "".join(f"{med[c]:>15.3f}" for c in COLS))


if __name__ == "__main__":
    main()
