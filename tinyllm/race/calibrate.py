"""The cost clock's coefficients for a model: which profile a run rests on, and measuring one.

``cost_profile(model, choice)`` returns the CostModel the race, ``tinyllm whatif`` and ``tinyllm
tune`` price steps with. ``choice`` (``--cost-profile``, else ``TINYLLM_COST_PROFILE``) is a file
(e.g. a profile measured on a GPU), ``reference`` (the profile shipped for the bundled model) or
``measure`` (calibrate now). Without one: this machine's profile for this model where one was
measured and fitted well (cached), else the bundled model's reference profile, else (another
model, no reference) a calibration now. A default run never re-fits: the first run on any
machine rests on the reference and gives the same figures as every later one.

A calibration races a small seeded workload on the wall clock with every kind of lane, round
after round, and keeps each pass's *fastest* time, as ``timeit`` does: the schedules are the
same every round, so step i of a lane does the same work each time, and contention only ever
adds time. It stops once a round no longer lowers the passes' total (within CONVERGED), or at
MAX_ROUNDS / BUDGET_S on a busy machine, and says how far from converged it stopped. The cost
model is fitted to those times; its fit (median and p95 relative error) is kept with it.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from tinyllm.config import EngineConfig
from tinyllm.machine import cpu_name
from tinyllm.race.cost import CHOICES, CostModel, PassWork, fit, fit_error

MIN_ROUNDS, MAX_ROUNDS = 3, 12
CONVERGED = 0.01  # a round that lowers the passes' summed fastest times by less than this ends it
BUDGET_S = 90.0  # no round starts after this long: a busy machine stops, saying how far it got
GOOD_FIT = 0.25  # a profile whose median error is above this is not cached
ENV = "TINYLLM_COST_PROFILE"
# The bundled model's profile, measured on a quiet machine (scripts/reference_profile.py says
# how): the figures of a first run anywhere, until this machine's own is measured.
REFERENCE = Path(__file__).resolve().parent.parent / "data" / "cost" / "shakespeare-cpu.json"


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
    parts = [
        repr(cfg),
        str(p.dtype),
        str(p.device),
        str(torch.get_num_threads()),
        torch.__version__,
        cpu_name(),
        FORWARD,
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def cost_profile(model, choice: str | None = None, say: Callable[[str], None] | None = None) -> CostModel:
    """The cost model to price ``model``'s steps with (see the module docstring); ValueError
    naming what is wrong with a choice that cannot be had."""
    say = say or (lambda text: print(text, file=sys.stderr))
    choice = choice or os.environ.get(ENV) or None
    cached = cache_dir() / f"{profile_key(model)}.json"
    reference_choice, measure_choice = CHOICES
    if choice == reference_choice:
        reference = reference_profile(model)
        if reference is None:
            raise ValueError(
                "there is a reference profile for the bundled model on the CPU only: give a profile's file, "
                "or 'measure' to calibrate this model here"
            )
        return reference
    if choice == measure_choice:
        return measure(model, cached, say)
    if choice:
        return CostModel.load(choice)
    if cached.is_file():
        try:
            return CostModel.load(cached)
        except ValueError:
            pass  # a damaged cache file: as if there were none
    reference = reference_profile(model)
    if reference is not None:
        return reference
    say("cost clock: no profile of this model yet (the reference is the bundled model's): measuring one")
    return measure(model, cached, say)


def reference_profile(model) -> CostModel | None:
    """The shipped profile, where ``model`` is the bundled one on the CPU (its shape and dtype)."""
    from tinyllm.model.config import load_config_and_tokenizer

    p = next(model.parameters())
    if p.device.type != "cpu" or p.dtype != torch.float32:
        return None
    try:
        bundled, _ = load_config_and_tokenizer()
    except (OSError, ValueError):
        return None
    return CostModel.load(REFERENCE) if model.cfg == bundled else None


def measure(model, cached: Path, say: Callable[[str], None]) -> CostModel:
    """Calibrate now; cached for the next runs only where it fits well."""
    say("calibrating the cost clock for this model on this machine (the fastest of repeated passes)…")
    fitted, (median, p95), n, how_far = calibrate(model, say)
    profile = CostModel(
        **{
            **fitted.__dict__,
            "source": f"fitted on this machine over {n} passes ({how_far}): median error {median:.0%}, p95 {p95:.0%}",
        }
    )
    if median > GOOD_FIT:  # the passes' times do not follow their work: a busy machine, or a poor model
        say(
            f"cost clock: {profile.source}: a poor fit, used for this run and not kept (measure it again "
            f"on a quiet machine: --cost-profile measure)"
        )
        return profile
    say(f"cost clock: {profile.source} (kept in {cached}: later runs rest on it)")
    try:
        cached.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(profile.to_json())
        tmp.replace(cached)  # (concurrent calibrations: the last one wins, whole)
    except OSError as e:
        say(f"cost clock: could not keep the profile ({e.strerror or e}); it is measured again next time")
    return profile


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


def calibrate(
    model, say: Callable[[str], None] = lambda _text: None
) -> tuple[CostModel, tuple[float, float], int, str]:
    """(the fitted model, its (median, p95) relative error, passes fitted, how far from converged
    it stopped): rounds of the calibration workload on the wall clock, each lane's pass i timed
    at its fastest (see the module docstring)."""
    from tinyllm.race.race import build_race

    max_len = min(model.cfg.max_seq_len, 192)
    work = calibration_workload(model.cfg.vocab_size, max_len)
    lanes = ("static", "continuous", "chunked")
    fastest: dict[tuple[str, int], float] = {}
    works: dict[tuple[str, int], PassWork] = {}
    start, last_total, rounds = time.perf_counter(), None, 0
    while True:
        race = build_race(model, work, EngineConfig.best(max_num_seqs=8, max_len=max_len), lanes=lanes)
        for lane in race.lanes:
            lane.clock.samples = []
        while race.step() is not None:
            pass
        for lane in race.lanes:
            for i, (w, s) in enumerate(lane.clock.samples):
                fastest[(lane.key, i)] = min(s, fastest.get((lane.key, i), s))
                works[(lane.key, i)] = w
        rounds += 1
        total = sum(fastest.values())
        drop = None if last_total is None else (last_total - total) / last_total
        say(
            f"  round {rounds}: {len(fastest)} passes, fastest times {total * 1e3:.0f} ms in all"
            + ("" if drop is None else f" ({drop:.1%} lower)")
        )
        if drop is not None and drop < CONVERGED and rounds >= MIN_ROUNDS:
            how_far = f"converged in {rounds} rounds: the last lowered the total by {drop:.1%}"
            break
        if rounds >= MAX_ROUNDS or time.perf_counter() - start > BUDGET_S:
            how_far = f"not converged: stopped after {rounds} round(s), {time.perf_counter() - start:.0f} s" + (
                "" if drop is None else f", the last still lowered the total by {drop:.1%}"
            )
            break
        last_total = total
    samples = [(works[k], fastest[k]) for k in fastest]
    fitted = fit(samples)
    return fitted, fit_error(fitted, samples), len(samples), how_far


def describe(profile: CostModel) -> str:
    """One line: the coefficients and where they came from."""
    return (
        f"cost clock: {profile.fixed_s * 1e3:.3g} ms a pass + {profile.per_row_s * 1e6:.3g} µs a row + "
        f"{profile.per_token_s * 1e6:.3g} µs a token + {profile.per_kv_token_s * 1e9:.3g} ns a K/V token read "
        f"({profile.source})"
    )
