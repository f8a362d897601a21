"""``tinyllm whatif``: a recording's (or a workload's) requests under several lanes' settings,
compared request by request: its parser and its command (the lab's machinery is in
race/whatif.py, its tables in race/whatif_view.py)."""

from __future__ import annotations

import json
import sys

from tinyllm.args import (
    SLOTS_WITH_KV_MEMORY,
    UsageError,
    add_clock_args,
    add_slo_arg,
    load_model,
    non_negative_float,
    output_path,
    positive_int,
    refuse_writing_over,
)
from tinyllm.config import EngineConfig
from tinyllm.engine_args import COMMAND_ENGINE_OPTIONS, add_engine_args, add_source_args, lane_cap

WHATIF_HELP = (
    "replay a recording's (or a workload's) requests under other engine "
    "settings, side by side, and compare them request by request"
)


def add_whatif_args(wi) -> None:
    """Every option of ``tinyllm whatif``."""
    add_source_args(wi)
    wi.add_argument(
        "--lanes",
        nargs="+",
        required=True,
        metavar="LANE",
        help="at least two lanes, one argument each: a policy, a lane kind, and/or key=value settings, "
        'e.g. --lanes fcfs priority "fair budget=64" (keys: policy, budget, slots, block, blocks, '
        "prefix, chunked, kv, kv_mib: the lane's own KV memory in MiB, kv_dtype: its KV cache dtype). "
        "On a recording, a lane runs at the recorded engine's settings except those it (or an "
        'option) sets: --lanes fcfs "fcfs blocks=96" is the recorded run and one with 96 blocks',
    )
    wi.add_argument(
        "--json", type=output_path, metavar="OUT.json", default=None, help="also write the comparison as JSON"
    )
    wi.add_argument(
        "--step-cost",
        type=non_negative_float,
        default=None,
        metavar="S",
        help="charge every step exactly S seconds (times become exact; instead of --clock)",
    )
    add_clock_args(wi)
    wi.add_argument(
        "--rows", type=positive_int, default=20, metavar="N", help="requests shown, most changed first (20)"
    )
    add_slo_arg(wi)
    add_engine_args(wi, *COMMAND_ENGINE_OPTIONS["whatif"])  # (on a recording, one not given is the recording's)


def cmd_whatif(args) -> None:
    """A recording's or workload's requests under several lanes' settings, compared per request."""
    import torch
    from rich.console import Console

    from tinyllm.bench.report import stdout_console
    from tinyllm.observe.recording import RecordingError, write_text
    from tinyllm.race.race import build_race
    from tinyllm.race.spec import (
        LaneSpecError,
        check_memory_options,
        check_pool_options_used,
        on_recording,
        parse_lanes,
        set_by_options,
    )
    from tinyllm.race.whatif import compare, load_arrivals, load_judging, recorded_settings, same_schedule, to_json
    from tinyllm.race.whatif_view import groups_table, lanes_table, request_lanes, requests_table
    from tinyllm.workload import WorkloadError

    refuse_writing_over("--json", args.json, args.source)
    try:
        lanes = parse_lanes(args.lanes)
    except LaneSpecError as e:
        raise UsageError(f"--lanes: {e}") from None
    try:
        check_memory_options(lanes, args.kv_memory, args.kv_blocks, args.max_num_seqs)
    except LaneSpecError as e:
        raise UsageError(str(e)) from None
    if args.kv_memory is not None and args.slots is not None:
        raise UsageError(SLOTS_WITH_KV_MEMORY + " (a lane's slots= caps that lane)")
    try:
        recorded = recorded_settings(args.source)  # None: a workload, no settings of its own
    except RecordingError as e:
        raise UsageError(str(e)) from None
    notes: list[str] = []
    if recorded is not None:  # an option given wins over the recording
        typed = {**vars(args), "kv_cache_dtype": None if args.kv_cache_dtype == "auto" else args.kv_cache_dtype}
        recorded = recorded.without(set_by_options(typed))  # (auto: the default, not told from a typed one)
        lanes, notes = on_recording(lanes, recorded, args.block_size)
    try:
        check_pool_options_used(lanes, args.kv_blocks, args.block_size)
    except LaneSpecError as e:
        raise UsageError(str(e)) from None
    if args.speculative_config and not any(s.spec for s in lanes):
        raise UsageError(
            "--speculative-config says how a lane with spec=N drafts (its method, draft model, lookup); no lane "
            "has one: add one, e.g. --lanes chunked 'chunked spec=4'"
        )
    if (args.speculative_config or {}).get("speculative_model") and args.clock != "wall":
        raise UsageError(
            "--speculative-config: a draft model's own passes are not in the cost clock's profile (it prices the "
            "model's), so its lane would look faster than it is: race a draft model with --clock wall"
        )
    max_len = args.max_len or (recorded.max_len if recorded else 512)
    if args.cost_profile is not None and (args.clock == "wall" or args.step_cost is not None):
        raise UsageError("--cost-profile is the cost clock's: drop it, or --clock wall / --step-cost")
    torch.set_num_threads(args.threads)
    model, tok = load_model(args)
    clock = args.step_cost
    if clock is None and args.clock != "wall":  # (the cost clock by default)
        from tinyllm.race.calibrate import cost_profile

        try:
            clock = cost_profile(model, args.cost_profile)
        except ValueError as e:
            raise UsageError(f"--cost-profile: {e}") from None
    try:
        arrivals, warning = load_arrivals(args.source, tok.encode, max_len, args.max_new_tokens)
        judging = load_judging(args.source, args.slo)
        run = EngineConfig.from_args(args, kv="paged", chunked_prefill=True, max_len=max_len)
        lane_model, bpt, why_real = lanes_model(model, clock, lanes)
        if why_real:
            notes.append(why_real)
        race = build_race(
            lane_model, arrivals, run, lanes=lanes, step_cost_s=clock, lane_cap=lane_cap(args), bytes_per_token=bpt
        )
    except (RecordingError, WorkloadError, ValueError) as e:
        raise UsageError(str(e)) from None
    except (MemoryError, OverflowError, RuntimeError) as e:  # a budget whose pool cannot be allocated
        what = f"--kv-memory {args.kv_memory:g} MiB" if args.kv_memory else "the lanes' kv_mib="
        raise UsageError(
            f"cannot allocate the KV memory {what} asks for (every lane allocates its own): "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'out of memory'}"
        ) from None
    for w in filter(None, [warning, *notes]):
        print(f"tinyllm whatif: warning: {w}", file=sys.stderr)
    err = Console(stderr=True)
    with err.status(f"running {len(arrivals)} requests in {len(lanes)} lanes…"):
        while race.step() is not None:
            pass
    views = race.views()
    rows = compare(views, judging)
    out = stdout_console()  # piped: wide, as the bench's
    if recorded is not None:
        out.print(f"as recorded, unless a lane or an option says otherwise: {recorded.describe()}", highlight=False)
    out.print(lanes_table(views, judging))
    out.print(clock_line(clock), highlight=False)  # (what every time above rests on)
    if bpt is not None:
        out.print(STAND_IN_LINE, highlight=False)
    groups = groups_table(views, rows)
    if groups is not None:
        out.print(groups)
    alike = [v.title for v in views[1:] if same_schedule(views[0], v)]
    if len(alike) == len(views) - 1:  # nothing but noise could tell the lanes apart: no ranking
        out.print(
            f"identical schedules: {', '.join(alike)} made the same decisions as {views[0].title} on every "
            "step (the same steps, waits and preemptions per request): no per-request differences to rank",
            highlight=False,
        )
        rows = ()
    else:
        if alike:
            out.print(f"identical schedules to lane A: {', '.join(alike)}", highlight=False)
        narrow = out.width < 24 + (22 + 6 * judging.active) * len(views)
        out.print(requests_table(views, rows, args.rows, narrow=narrow, judging=judging))
    if rows:
        out.print(request_lanes(views, rows[0], min(out.width, 160)))  # (a step a cell: not 400 of them)
    if args.json:
        try:
            report = {
                **to_json(views, compare(views, judging), args.source, judging),
                "clock": clock_json(clock),
                "stand_in": bpt is not None,
                "identical_schedules": alike,
            }
            write_text(args.json, json.dumps(report, indent=1))
        except OSError as e:
            raise UsageError(f"--json {args.json}: cannot write it: {e.strerror or e}") from None
        print(f"wrote {args.json}", file=sys.stderr)


STAND_IN_LINE = (
    "lanes run on a one-layer stand-in model: greedy lanes that ignore end-of-text make exactly their "
    "max_new_tokens whatever the weights, so on this clock the figures are the real model's (its KV bytes "
    "per token size the pools)"
)


def lanes_model(model, clock, lanes):
    """What the lanes run on: a one-layer stand-in where the figures rest on token counts alone
    (the cost clock or a fixed step cost: race lanes are greedy and ignore end-of-text, so each
    request makes exactly its max_new_tokens whatever the weights; tune's module docstring says
    more), with the real model's KV bytes per token for the pools; the real model where a lane's
    figures depend on the text it writes (``spec=``: its drafts' acceptance) or on the forward's
    measured time (the wall clock). Returns (model, bytes_per_token or None, a note or "")."""
    from tinyllm.engine import kv_bytes_per_token
    from tinyllm.tune.evaluate import stand_in

    if clock is None:  # the wall clock times the real forward
        return model, None, ""
    spec = [s.label for s in lanes if getattr(s, "spec", None)]
    if spec:
        return model, None, f"lane(s) {', '.join(spec)} run on the real model: a draft's acceptance follows its text"
    device = next(model.parameters()).device
    sizes: dict[str, int] = {}

    def bytes_per_token(kv_dtype: str) -> int:
        if kv_dtype not in sizes:
            sizes[kv_dtype] = kv_bytes_per_token(model, device, kv_dtype)
        return sizes[kv_dtype]

    return stand_in(model), bytes_per_token, ""


def clock_line(clock) -> str:
    """What the times rest on, said above every what-if table."""
    if clock is None:
        return "clock: wall (each lane's measured compute: figures vary run to run with the machine's load)"
    if isinstance(clock, float):
        return f"clock: every step costs {clock:g} s (--step-cost)"
    from tinyllm.race.calibrate import describe

    return describe(clock) + ": the same model for every lane, the same figures every run"


def clock_json(clock) -> dict:
    if clock is None:
        return {"kind": "wall"}
    if isinstance(clock, float):
        return {"kind": "fixed", "step_s": clock}
    return {"kind": "cost", **vars(clock)}
