"""A tuning session: the requests, the model and the search space from a command line
(``prepare``: every refusal a UsageError before any work), then the search, each change undone,
and the wall-clock check (``execute``). The CLI (command.py) and the live view
(tui/tune_app.py) both drive it; report.py says the answer."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from tinyllm.args import UsageError, load_model
from tinyllm.config import EngineConfig
from tinyllm.tune.evaluate import Bench, Outcome
from tinyllm.tune.search import SearchResult
from tinyllm.tune.space import Point


@dataclass
class Session:
    """What ``prepare`` checked and loaded."""

    args: object  # the parsed options (command.py's add_tune_args)
    bench: Bench
    grid: list[Point]
    base: Point  # the defaults
    model: object  # the real model (the bench's may be the stand-in)
    kv_mib: float


@dataclass
class Answer:
    result: SearchResult
    undone: list[tuple[str, Outcome]] = field(default_factory=list)  # the winner with one change undone
    wall: object = None  # report.WallCheck, or None (skipped, or the defaults won)


def with_rate(arrivals: list, rate: float) -> list:
    """The requests at ``rate`` requests/s (see --rate), in the same order."""
    last = max((t for t, _ in arrivals), default=0.0)
    if last > 0 and len(arrivals) > 1:
        factor = (len(arrivals) - 1) / last / rate
        return [(round(t * factor, 6), r) for t, r in arrivals]
    rng, t, out = random.Random(0), 0.0, []
    for _, r in arrivals:
        out.append((round(t, 6), r))
        t += rng.expovariate(rate)
    return out


def prepare(args) -> Session:
    """The session's inputs, checked (UsageError, one line, for anything wrong)."""
    from pathlib import Path

    from tinyllm.observe.recording import RecordingError
    from tinyllm.race.whatif import is_recording, load_arrivals, load_judging, recorded_settings
    from tinyllm.tune.evaluate import Bench, kv_budget_mib, stand_in
    from tinyllm.tune.space import SearchError, defaults, parse_search, points
    from tinyllm.workload import WorkloadError, resolve_workload

    try:
        space = parse_search(args.search)
    except SearchError as e:
        raise UsageError(str(e)) from None
    path = Path(args.source).expanduser()
    recording = path.exists() and is_recording(path)
    if not recording:
        try:
            resolve_workload(args.source)
        except WorkloadError as e:
            raise UsageError(str(e)) from None
    try:
        judging = load_judging(args.source, args.slo)
    except (RecordingError, WorkloadError, ValueError) as e:
        raise UsageError(str(e)) from None
    if args.objective == "goodput" and not judging.active:
        raise UsageError(
            "--objective goodput needs an SLO: give --slo ttft=…,tpot=… (e.g. ttft=500ms,tpot=50ms), or "
            "--objective throughput or latency-p95"
        )
    import torch  # (once every argument is checked: a mistake is refused at once)

    from tinyllm.engine import kv_bytes_per_token

    torch.set_num_threads(args.threads)
    model, tok = load_model(args)
    device = next(model.parameters()).device
    recorded = recorded_settings(args.source) if recording else None
    max_len = args.max_len or (recorded.max_len if recorded else model.cfg.max_seq_len)
    try:
        arrivals, warning = load_arrivals(args.source, tok.encode, max_len, args.max_new_tokens)
    except (RecordingError, WorkloadError, ValueError) as e:
        raise UsageError(str(e)) from None
    if warning:
        print(f"tinyllm tune: warning: {warning}", file=sys.stderr)
    arrivals = sorted(arrivals, key=lambda a: a[0])  # (as build_race numbers them)
    if args.rate is not None:
        arrivals = with_rate(arrivals, args.rate)
    from tinyllm.race.calibrate import cost_profile

    try:
        clock = cost_profile(model, args.cost_profile)
    except ValueError as e:
        raise UsageError(f"--cost-profile: {e}") from None
    bpt = {d: kv_bytes_per_token(model, device, d) for d in ("auto", "float32", "bfloat16")}
    kv_mib = args.kv_memory or kv_budget_mib(defaults(False).max_num_seqs, max_len, bpt["auto"])
    base = defaults(args.kv_memory is not None)
    grid = points(space, base)
    if not grid:
        raise UsageError(
            "--search leaves no configuration the engine can run (each needs max_batched_tokens >= max_num_seqs)"
        )
    bench = Bench(stand_in(model) if args.stand_in else model, arrivals, judging, clock, max_len, kv_mib, bpt, model)
    return Session(args, bench, grid, base, model, kv_mib)


def execute(
    s: Session, on_done: Callable[[Outcome], None] | None = None, on_phase: Callable[[str], None] | None = None
) -> Answer:
    """The search (``on_done`` hears every point run), each of the winner's changes undone, and
    the wall-clock check (``on_phase`` hears each phase begin)."""
    import torch

    from tinyllm.tune.evaluate import Evaluator
    from tinyllm.tune.report import reverted
    from tinyllm.tune.search import search

    args, bench, base = s.args, s.bench, s.base
    n = len(bench.arrivals)
    say = on_phase or (lambda text: None)
    say(f"searching {len(s.grid)} configurations")
    torch.set_num_threads(1)  # the stand-in's tiny passes: one thread each
    evaluator = Evaluator(bench, args.jobs, on_done)
    try:
        result = search(s.grid, base, evaluator, n, args.objective, args.budget_s)
        winner = result.final[0]
        say("each of the winner's changes undone")
        changed = reverted(winner.point, base)
        undone = list(zip((name for name, _ in changed), evaluator([p for _, p in changed], winner.requests)))
        check, on_cost = check_length(evaluator, winner.point, base, n, args.objective, args.confirm_requests)
    finally:
        evaluator.close()
    torch.set_num_threads(args.threads)
    wall = None
    if args.confirm and winner.point != base and not winner.error:
        say(f"the winner and the defaults on the wall clock (the real model, {check} requests)")
        wall = wall_check(s.model, bench, winner.point, base, check, args.objective, on_cost)
    return Answer(result, undone, wall)


def check_length(evaluator, winner, base, n: int, objective: str, asked: int | None) -> tuple[int, list]:
    """How many requests the wall-clock check runs, and the cost clock's outcomes for the winner
    and the defaults on them: ``asked`` (--confirm-requests), else the shortest of the search's
    prefixes on which the cost clock already puts the winner ahead (a prefix where the two tie
    would confirm nothing), else all."""
    from tinyllm.tune.search import prefixes, score

    if asked:
        return min(n, asked), evaluator([winner, base], min(n, asked))
    for m in prefixes(n):
        outs = evaluator([winner, base], m)
        if score(outs[0], objective)[:2] < score(outs[1], objective)[:2]:
            return m, outs
    return n, outs


def wall_check(model, bench, winner, base, n: int, objective: str, on_cost):
    """The winner and the defaults in one race on the wall clock, the real model, on the first
    ``n`` requests: whether the cost clock's ranking of the two (``on_cost``: its outcomes for
    them on the same requests) holds on measured time."""
    from dataclasses import replace

    from tinyllm.race.race import build_race
    from tinyllm.tune.evaluate import lane_spec, outcome_of
    from tinyllm.tune.report import WallCheck

    real = replace(bench, model=model, clock=None)
    specs = (lane_spec(winner, real, "winner"), lane_spec(base, real, "defaults"))
    run = EngineConfig.best(max_num_seqs=winner.max_num_seqs, max_len=real.max_len)
    race = build_race(model, real.arrivals[:n], run, lanes=specs, step_cost_s=None)
    while race.step() is not None:
        pass
    views = race.views()
    w, d = (outcome_of(p, n, lane, v, real) for p, lane, v in zip((winner, base), race.lanes, views))
    return WallCheck(w, d, objective, on_cost[0], on_cost[1])
