"""The cost clock's coefficients for a model on this machine: measured once, then cached.

``cost_profile(model)`` returns the CostModel the race and ``tinyllm whatif`` price steps with:
a file given (``--cost-profile``, or ``TINYLLM_COST_PROFILE``: e.g. a profile measured on a
GPU), else this machine's cached one for this model, else a fresh calibration (a few seconds):
a small seeded workload raced on the wall clock by every kind of lane, three times, each step's
median time taken (the schedules are the same every time, so step i of a lane does the same
work in each round), and the cost model fitted to those steps. How well it fits (median and
p95 relative error over the calibration's steps) is kept with it and printed once.
"""

from __future__ import annotations

import hashlib
import os
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from tinyllm.config import EngineConfig
from tinyllm.race.cost import CostModel, PassWork, fit, fit_error

ROUNDS = 3
GOOD_FIT = 0.25  # a profile whose median error is above this is not cached
ENV = "TINYLLM_COST_PROFILE"


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/tinyllm/cost, else ~/.cache/tinyllm/cost."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tinyllm" / "cost"


FORWARD = "ragged-1"  # the forward the passes were timed on: a profile of another one is measured again


def profile_key(model) -> str:
    """What the coefficients depend on: the model's shape and dtype, the device, torch's threads
    and version, the CPU (a profile is this machine's) and the forward's version."""
    cfg = model.cfg
    p = next(model.parameters())
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            cpu = next((line for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    parts = [repr(cfg), str(p.dtype), str(p.device), str(torch.get_num_threads()), torch.__version__, cpu, FORWARD]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def cost_profile(model, path: str | None = None, say: Callable[[str], None] | None = None) -> CostModel:
    """The cost model to price ``model``'s steps with (see the module docstring)."""
    say = say or (lambda text: print(text, file=sys.stderr))
    path = path or os.environ.get(ENV) or None
    if path:
        return CostModel.load(path)
    cached = cache_dir() / f"{profile_key(model)}.json"
    if cached.is_file():
        try:
            return CostModel.load(cached)
        except ValueError:
            pass  # a damaged cache file: measured again
    say("calibrating the cost clock for this model on this machine (once; a few seconds)…")
    model_, (median, p95), n = calibrate(model)
    model_ = CostModel(
        **{
            **model_.__dict__,
            "source": f"fitted on this machine over {n} steps: median error {median:.0%}, p95 {p95:.0%}",
        }
    )
    if median > GOOD_FIT:  # a busy machine times noise: this profile serves this run only
        say(
            f"cost clock: {model_.source}: a poor fit (was the machine busy?), not cached: measured again next "
            f"time (or give --cost-profile)"
        )
        return model_
    say(f"cost clock: {model_.source} (cached in {cached})")
    try:
        cached.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(model_.to_json())
        tmp.replace(cached)  # (concurrent calibrations: the last one wins, whole)
    except OSError as e:
        say(f"cost clock: could not cache the profile ({e.strerror or e}); it is measured again next time")
    return model_


def calibration_workload(vocab: int, max_len: int, seed: int = 0) -> list:
    """Seeded requests of mixed lengths, all at t=0: prefills, chunks and decodes of many sizes."""
    from tinyllm.engine import Request

    rng = random.Random(seed)
    out = []
    for _ in range(12):
        prompt = rng.randrange(4, max(5, min(128, max_len // 2)))
        new = rng.randrange(4, max(5, min(48, max_len - prompt)))
        out.append((0.0, Request([rng.randrange(1, vocab) for _ in range(prompt)], new)))
    return out


def calibrate(model) -> tuple[CostModel, tuple[float, float], int]:
    """(the fitted model, its (median, p95) relative error, steps fitted): ROUNDS races of the
    calibration workload on the wall clock, each lane's step i timed at its median."""
    from tinyllm.race.race import build_race

    max_len = min(model.cfg.max_seq_len, 192)
    work = calibration_workload(model.cfg.vocab_size, max_len)
    lanes = ("static", "continuous", "chunked")
    times: dict[tuple[str, int], list[float]] = {}
    works: dict[tuple[str, int], PassWork] = {}
    for _ in range(ROUNDS):
        race = build_race(model, work, EngineConfig.best(max_num_seqs=8, max_len=max_len), lanes=lanes)
        for lane in race.lanes:
            lane.clock.samples = []
        while race.step() is not None:
            pass
        for lane in race.lanes:
            for i, (w, s) in enumerate(lane.clock.samples):
                times.setdefault((lane.key, i), []).append(s)
                works[(lane.key, i)] = w
    samples = [(works[k], statistics.median(v)) for k, v in times.items() if len(v) == ROUNDS]
    fitted = fit(samples)
    return fitted, fit_error(fitted, samples), len(samples)


def describe(profile: CostModel) -> str:
    """One line: the coefficients and where they came from."""
    return (
        f"cost clock: {profile.fixed_s * 1e3:.3g} ms a pass + {profile.per_row_s * 1e6:.3g} µs a row + "
        f"{profile.per_token_s * 1e6:.3g} µs a token + {profile.per_kv_token_s * 1e9:.3g} ns a K/V token read "
        f"({profile.source})"
    )
