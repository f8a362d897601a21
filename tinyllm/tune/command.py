"""``tinyllm tune``: the engine settings that serve a recording's or a workload's requests best
under an SLO, each configuration a what-if lane on the cost clock (race/race.py), the search in
search.py, the answer in report.py."""

from __future__ import annotations

import json
import random
import sys

from tinyllm.args import (
    UsageError,
    add_engine_args,
    add_model_args,
    add_slo_arg,
    load_model,
    output_path,
    positive_float,
    positive_int,
    refuse_writing_over,
)
from tinyllm.tune.search import OBJECTIVES
from tinyllm.tune.space import SETTINGS


def add_tune_parser(sub) -> None:
    tu = sub.add_parser(
        "tune",
        help="search engine settings (concurrency cap, token budget, chunked prefill, prefix cache, block "
        "size, policy, KV dtype) for the ones that serve a recording or a workload best under an SLO",
    )
    add_model_args(tu)
    tu.add_argument(
        "source",
        metavar="RUN.jsonl|WORKLOAD",
        help="a recording (tinyllm-tui --record, or a server's state stream), a workload file, or a "
        "bundled workload's name (e.g. poisson_arrivals, long_tail)",
    )
    add_slo_arg(tu)
    tu.add_argument(
        "--search",
        nargs="+",
        action="extend",
        metavar="SETTING=V1,V2",
        help=f"the settings to search and their values (the others stay at the defaults), e.g. "
        f"max_num_seqs=4,8,16 max_batched_tokens=64..512 prefix_cache=on,off; settings: {', '.join(SETTINGS)}; "
        "default: every setting over a few values",
    )
    tu.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="goodput",
        help="what the best settings maximise: goodput (requests/s meeting the SLO; the default), "
        "throughput (tok/s) or latency-p95 (lowest)",
    )
    tu.add_argument(
        "--budget-s",
        type=positive_float,
        default=None,
        metavar="S",
        help="stop the search after the round running when S seconds have passed (the answer then "
        "rests on a prefix of the requests, and says so)",
    )
    tu.add_argument(
        "--rate",
        type=positive_float,
        default=None,
        metavar="R",
        help="replay at R requests/s: a workload's arrival times scaled to that mean rate, or, for one "
        "without arrivals, Poisson arrivals at R (seeded: the same every run)",
    )
    tu.add_argument("--json", type=output_path, metavar="OUT.json", default=None, help="also write the answer as JSON")
    tu.add_argument(
        "--jobs",
        type=positive_int,
        default=1,
        metavar="N",
        help="run points in N processes (default 1; each point's result is the same either way)",
    )
    tu.add_argument(
        "--confirm-requests",
        type=positive_int,
        default=None,
        metavar="N",
        help="re-run the winner and the defaults on the wall clock (the real model) on the first N "
        "requests, to check the cost clock's ranking of the two (default: the shortest of the search's "
        "prefixes, a quarter, a half or all, on which the cost clock already puts the winner ahead)",
    )
    tu.add_argument("--no-confirm", dest="confirm", action="store_false", help="skip the wall-clock check")
    tu.add_argument(
        "--no-stand-in",
        dest="stand_in",
        action="store_false",
        help="run every point on the real model (slower; the default runs them on a one-layer stand-in "
        "of the same vocabulary: the schedule and the cost clock follow the token counts, not the weights)",
    )
    tu.add_argument(
        "--cost-profile",
        metavar="FILE",
        default=None,
        help="the cost clock's coefficients from FILE (e.g. measured on the machine that will serve; "
        "default: $TINYLLM_COST_PROFILE, else this machine's, calibrated once and cached)",
    )
    tu.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help="for a workload line without max_new_tokens (64; not a cap: a line's own wins)",
    )
    tu.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        metavar="N",
        help="torch CPU threads for the cost profile's calibration and the wall-clock check (default 1: "
        "on a machine whose cores others use, a second thread waits for a core and steps run several "
        "times slower; a profile is measured per thread count)",
    )
    add_engine_args(tu, "kv_memory", "max_len")
    tu.set_defaults(fn=cmd_tune)


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


def cmd_tune(args) -> None:
    """Search, report, check on the wall clock, and write the JSON."""
    from pathlib import Path

    import torch
    from rich.console import Console

    from tinyllm.engine import kv_bytes_per_token
    from tinyllm.observe.recording import RecordingError, write_text
    from tinyllm.race.whatif import is_recording, load_arrivals, load_judging, recorded_settings
    from tinyllm.tune.evaluate import Bench, kv_budget_mib, stand_in
    from tinyllm.tune.space import SearchError, defaults, parse_search, points
    from tinyllm.workload import WorkloadError, resolve_workload

    refuse_writing_over("--json", args.json, args.source)
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
    torch.set_num_threads(args.threads)
    model, tok = load_model(args)
    device = next(model.parameters()).device
    recorded = recorded_settings(args.source) if recording else None
    max_len = args.max_len or (recorded.max_len if recorded else model.cfg.max_seq_len)
    try:
        arrivals, warning = load_arrivals(
            args.source, tok.encode, max_len, args.max_new_tokens or 64, asked_new=args.max_new_tokens is not None
        )
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
    bench = Bench(stand_in(model) if args.stand_in else model, arrivals, judging, clock, max_len, kv_mib, bpt)
    run_search(args, bench, grid, base, model, kv_mib, write_text, Console)


def run_search(args, bench, grid, base, model, kv_mib, write_text, Console) -> None:
    """The search with a live status line, then the answer (split from cmd_tune for length)."""
    import torch

    from tinyllm.race.calibrate import describe
    from tinyllm.tune.evaluate import Evaluator
    from tinyllm.tune.report import (
        TRANSFER,
        ablation_table,
        changes_table,
        front_table,
        margin,
        ranking_table,
        reverted,
        serve_command,
        to_json,
        vllm_command,
        wall_line,
    )
    from tinyllm.tune.search import pareto_front, search

    err = Console(stderr=True)
    n = len(bench.arrivals)
    done = [0]
    with err.status(f"tuning: {len(grid)} configurations on {n} requests…") as status:

        def on_done(o) -> None:
            done[0] += 1
            status.update(
                f"tuning: {done[0]} runs done ({len(grid)} configurations; this round on {o.requests} requests)"
            )

        torch.set_num_threads(1)  # the stand-in's tiny passes: one thread each
        evaluator = Evaluator(bench, args.jobs, on_done)
        try:
            result = search(grid, base, evaluator, n, args.objective, args.budget_s)
            winner = result.final[0]
            check, on_cost = check_length(evaluator, winner.point, base, n, args.objective, args.confirm_requests)
            changed = reverted(winner.point, base)
            undone = list(zip((name for name, _ in changed), evaluator([p for _, p in changed], winner.requests)))
        finally:
            evaluator.close()
        torch.set_num_threads(args.threads)
        wall = None
        if args.confirm and winner.point != base and not winner.error:
            status.update(f"the winner and the defaults on the wall clock (the real model, {check} requests)…")
            wall = wall_check(model, bench, winner.point, base, check, args.objective, on_cost)
    out = Console() if sys.stdout.isatty() else Console(width=160)  # piped: wide, no column folded
    slo = bench.judging.slo
    arrivals = any(t > 0 for t, _ in bench.arrivals)
    span = bench.arrivals[-1][0] if arrivals else 0.0
    out.print(
        f"tune {args.source}: {n} requests"
        + (f" arriving over {span:.1f} s" if arrivals else " all at once")
        + (f" (--rate {args.rate:g}/s)" if args.rate else "")
        + f"; SLO {slo or 'per request'}; KV memory {kv_mib:g} MiB"
        + ("" if args.kv_memory else " (the defaults' 8 slots of max_len: --kv-memory sets it)")
        + f"; objective {args.objective}",
        highlight=False,
    )
    rungs = ", ".join(f"{len(r.outcomes)} on {r.requests} requests" for r in result.rungs)
    out.print(
        f"searched {result.points} configurations by {result.method} ({rungs}; {result.runs} runs in "
        f"{result.seconds:.0f} s, {args.jobs} process{'es' * (args.jobs > 1)}"
        + ("; on a one-layer stand-in model" if args.stand_in else "")
        + ")",
        highlight=False,
    )
    out.print(describe(bench.clock), highlight=False)
    if result.stopped:
        out.print(f"[yellow]{result.stopped}[/]")
    out.print(ranking_table(result, args.objective, base, bench.judging.active))
    refused = {o.point: o.error for r in result.rungs for o in r.outcomes if o.error}
    if refused:
        first = next(iter(refused.values()))
        out.print(f"{len(refused)} configuration(s) refused by the engine, e.g.: {first}", highlight=False)
    front = pareto_front(result.final)
    out.print(front_table(front, base))
    out.print(
        f"winner: {'the defaults' if winner.point == base else winner.point.words(base)} — "
        f"{margin(winner, result.defaults, args.objective)}",
        highlight=False,
    )
    if winner.point != base:
        out.print(changes_table(winner, result.defaults))
    if undone:
        out.print(ablation_table(winner, undone, args.objective))
    if wall is not None:
        out.print(wall_line(wall, args.objective), highlight=False)
    serve = serve_command(winner.point, kv_mib, args.max_len, args.model)
    vllm, notes = vllm_command(winner.point)
    out.print("\nthe winner as command lines:", highlight=False)
    if winner.point.chunked_prefill:
        out.print(f"  {serve}", highlight=False, soft_wrap=True)
    else:
        out.print(
            "  tinyllm serve always runs chunked prefill; the winner's prefill-then-decode scheduler runs in "
            "tinyllm-tui --kv paged --no-chunked-prefill",
            highlight=False,
        )
    out.print(f"  {vllm}", highlight=False, soft_wrap=True)
    for note in notes:
        out.print(f"    ({note})", highlight=False)
    out.print(TRANSFER, highlight=False)
    if args.json:
        header = {
            "source": args.source,
            "requests": n,
            "rate": args.rate,
            "slo": None if slo is None else str(slo),
            "kv_memory_mib": kv_mib,
            "max_len": bench.max_len,
            "clock": {"kind": "cost", **vars(bench.clock)},
            "stand_in": args.stand_in,
        }
        commands = {"tinyllm_serve": serve if winner.point.chunked_prefill else None, "vllm": vllm, "notes": notes}
        report = to_json(result, args.objective, base, header, wall, commands, undone)
        try:
            write_text(args.json, json.dumps(report, indent=1))
        except OSError as e:
            raise UsageError(f"--json {args.json}: cannot write it: {e.strerror or e}") from None
        print(f"wrote {args.json}", file=sys.stderr)


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
    race = build_race(model, real.arrivals[:n], winner.max_num_seqs, real.max_len, lanes=specs, step_cost_s=None)
    while race.step() is not None:
        pass
    views = race.views()
    w, d = (outcome_of(p, n, lane, v, real) for p, lane, v in zip((winner, base), race.lanes, views))
    return WallCheck(w, d, objective, on_cost[0], on_cost[1])
