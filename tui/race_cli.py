"""`tinyllm-tui --race`: the race's options, their checks (no torch, no process) and the app
that runs the lanes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tinyllm.args import SLOTS_WITH_KV_MEMORY, option_names
from tinyllm.config import EngineConfig
from tinyllm.engine_args import lane_cap
from tinyllm.race.rules import DEFAULT_BATCH_TIMEOUT_S, DEFAULT_MAX_LEN, DEFAULT_WORKLOAD, check_static_batches
from tinyllm.race.views import LANES
from tinyllm.request import DEFAULT_MAX_BATCHED_TOKENS, ContextTooLong, check_fits
from tui.cli_checks import check_max_len, check_terminal, model_config, refuse_unused
from tui.runners.child import ChildRunner


def add_race_args(p: argparse.ArgumentParser) -> None:
    from tinyllm.args import add_clock_args, non_negative_float

    p.add_argument(
        "--race",
        nargs="?",
        const=DEFAULT_WORKLOAD,
        default=None,
        metavar="WORKLOAD|RUN.jsonl",
        help="race static batching, continuous batching and the token-budget scheduler on the same "
        f"requests (a bundled workload's name, a JSONL file, or a recording: its requests at their "
        f"recorded arrival times; default {DEFAULT_WORKLOAD})",
    )
    p.add_argument(
        "--batch-timeout",
        type=non_negative_float,
        default=None,
        metavar="S",
        help="--race with arrivals: static batching starts a partial batch once its oldest request has "
        f"waited S seconds of its clock (default {DEFAULT_BATCH_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--lanes",
        nargs="+",
        default=None,
        metavar="LANE",
        help=f"--race: at least two lanes, one argument each: a lane kind ({', '.join(LANES)}), a "
        f"scheduling policy, and/or key=value settings (policy, budget, slots, block, blocks, prefix, "
        f'chunked, kv, kv_mib), e.g. --lanes fcfs priority "fair budget=64" (default: the three '
        f"kinds). With --kv-memory MiB every lane gets that KV memory (a lane's kv_mib= its own): "
        f"static batching and slot KV the rows of --max-len it buys, the paged lanes the blocks it "
        f"buys, run by up to --max-num-seqs; a lane's slots= then caps its sequences, and blocks= "
        f"is refused",
    )
    add_clock_args(p, "--race: ")


def race_app(parser, a):
    """The race app for ``--race`` (None without it, after refusing race-only options)."""
    if a.race is None:
        for flag, value in (
            ("--batch-timeout", a.batch_timeout),
            ("--lanes", a.lanes),
            ("--clock", a.clock),
            ("--cost-profile", a.cost_profile),
        ):
            if value is not None:
                parser.error(f"{flag} applies to --race only")
        return None
    from tui.screens.race import RaceApp  # (the race's modules load only for a race)

    notes: list[str] = []
    spec = race_spec(parser, a, notes)
    for note in notes:  # (each lane's panel says what it took, too)
        print(f"tinyllm-tui --race: {note}", file=sys.stderr)
    check_terminal(parser, a)
    if a.engine_thread:
        from tui.runners.race import RaceRunner

        try:
            model, device = spec.build()
        except Exception as e:  # noqa: BLE001 - one line, exit 2
            parser.error(" ".join(str(e).split()))
        runner = RaceRunner(lambda: spec.make_race(model), a.paused, a.step_delay, device, a.threads)
    else:
        runner = ChildRunner(spec, paused=a.paused, step_delay_ms=a.step_delay).start(wait=False)
    from tinyllm.model.config import model_label

    name = model_label(a.model)
    return RaceApp(runner, workload=spec.name, model_name=name, judging=race_judging(parser, a))


def race_judging(parser, a):
    """What the race's requests are judged against: --slo, a workload line's own "slo", and how
    a recording saw each end (aborted / failed: left out of the ranking)."""
    from tinyllm.observe.recording import RecordingError
    from tinyllm.race.whatif import load_judging
    from tinyllm.workload import WorkloadError

    try:
        return load_judging(a.race, a.slo)
    except (WorkloadError, RecordingError) as e:
        parser.error(f"--race: {e}")


def race_spec(parser, a, notes: list[str] | None = None):
    """Check every race option (no torch, no process) and return the spec the race is built from.
    On a recording every lane starts from its recorded engine settings, a lane's own and the options
    given winning (``tinyllm whatif``'s rule); ``notes`` (a list) gets the lines that say so."""
    from tinyllm.workload import WorkloadError, resolve_workload
    from tui.runners.race import RaceSpec, race_workload

    for flag, value, why in (
        ("--replay", a.replay, "a race runs a model"),
        ("--attach", getattr(a, "attach", None), "a race runs a model here"),
        ("--record", a.record, "a race is not recorded"),
        ("--prompts", a.prompts, "give the workload to --race"),
        ("--kv", a.kv, "each lane has its own KV layout"),
        (
            "--scheduling-policy",
            None if a.scheduling_policy == "fcfs" else a.scheduling_policy,
            "each lane has its own: --lanes fcfs priority ...",
        ),
        ("--[no-]chunked-prefill", a.chunked_prefill, "the third lane is the chunked one"),
        ("--[no-]prefix-cache", a.prefix_cache, "the chunked lane caches prefixes"),
        ("--kv-events", a.kv_events, "it draws a vLLM server's prefix cache: --attach"),
    ):
        if value is not None:
            parser.error(f"{flag} does not apply to --race ({why})")
    refuse_unused(parser, a, "--race")
    path, cfg, tok = model_config(parser, a)
    from tinyllm.observe.recording import RecordingError
    from tinyllm.race import spec as lane_spec
    from tinyllm.race.whatif import recorded_settings, requests_from_recording

    try:
        lanes = lane_spec.parse_lanes(a.lanes)  # (at least two lanes: it refuses one)
    except lane_spec.LaneSpecError as e:
        parser.error(f"--lanes: {e}")
    try:
        lane_spec.check_memory_options(lanes, a.kv_memory, a.kv_blocks, a.max_num_seqs)
    except lane_spec.LaneSpecError as e:
        parser.error(str(e))
    if a.kv_memory is not None and "slots" in a.given:
        parser.error(SLOTS_WITH_KV_MEMORY + " (a lane's slots= caps that lane)")
    try:
        recorded = recorded_settings(a.race)  # None: a workload, no settings of its own
    except RecordingError as e:
        parser.error(f"--race: {e}")
    warnings: list[str] = []
    if recorded is not None:  # an option given wins over the recording
        recorded = recorded.without(lane_spec.set_by_options({dest: getattr(a, dest) for dest in a.given}))
        try:
            lanes, warnings = lane_spec.on_recording(lanes, recorded, a.block_size if "block_size" in a.given else None)
        except lane_spec.LaneSpecError as e:
            parser.error(f"--lanes: {e}")
    try:
        lane_spec.check_pool_options_used(lanes, a.kv_blocks, a.block_size if "block_size" in a.given else None)
    except lane_spec.LaneSpecError as e:
        parser.error(str(e))
    max_len = a.max_len or (recorded.max_len if recorded else min(cfg.max_seq_len, DEFAULT_MAX_LEN))
    check_max_len(parser, max_len, cfg)
    for lane in lanes:
        budget = lane.budget or a.max_batched_tokens or DEFAULT_MAX_BATCHED_TOKENS
        sized = lane.kv_mib is not None or a.kv_memory is not None  # a KV budget: the cap is max_num_seqs
        n = lane.slots or (a.max_num_seqs if sized else a.slots)
        if lane.kind == "chunked" and n and budget < n:
            which = f"--lanes {lane.label!r}" if a.lanes is not None else f"the {lane.label} lane"
            parser.error(
                f"{which}: its token budget {budget} is less than its {n} "
                f"{'sequences' if sized else 'slots'}: every running request decodes one token per step, "
                f"so the budget must cover them all"
            )
    try:
        source = Path(a.race).expanduser()
        if recorded is not None:
            arrivals, _ = requests_from_recording(source)
            work = tuple((t, tuple(r.prompt), r.max_new_tokens, r.priority, r.tenant) for t, r in arrivals)
            name = source.name
            for i, (t, ids, new, _, _) in enumerate(work):
                try:
                    check_fits(len(ids), new, max_len, "--max-len")
                except ContextTooLong as e:  # say which request
                    raise ContextTooLong(f"the request arriving at {t:.2f} s (#{i} in arrival order): {e}") from None
        else:
            wl_path = resolve_workload(a.race)
            work = race_workload(wl_path, tok.encode, max_len)
            name = wl_path.name.removesuffix(".jsonl")
        for lane in lanes:  # (at a KV budget, its batch size is checked once the model is loaded)
            if lane.kind == "static" and lane.kv_mib is None and a.kv_memory is None:
                check_static_batches(
                    [(len(w[1]), w[2]) for w in sorted(work, key=lambda w: w[0])],
                    lane.slots or a.slots,
                    cfg.max_seq_len,
                )
    except (WorkloadError, ContextTooLong, RecordingError) as e:
        parser.error(f"--race: {e}")
    if a.batch_timeout is not None:  # (it was accepted, and ignored, where it means nothing)
        if not any(lane.kind == "static" for lane in lanes):
            parser.error("--batch-timeout is static batching's wait for a full batch, and no lane here is static")
        if not any(w[0] > 0 for w in work):
            parser.error(
                f"--batch-timeout: every request of {name} arrives at once, so no batch waits for one; "
                f"it applies to a workload with arrival times (e.g. poisson_arrivals)"
            )
    check_lane_pools(parser, a, lanes, work, max_len)
    if notes is not None and recorded is not None:
        notes.append(f"as recorded, unless a lane or an option says otherwise: {recorded.describe()}")
        notes.extend(f"warning: {w}" for w in warnings)
    timeout = DEFAULT_BATCH_TIMEOUT_S if a.batch_timeout is None else a.batch_timeout
    check_cost_profile(parser, a)
    try:
        config = EngineConfig.from_args(a, kv="paged", chunked_prefill=True, max_len=max_len)
    except ValueError as e:
        parser.error(option_names(str(e)))
    return RaceSpec(
        str(path),
        work,
        name,
        config,
        timeout,
        lanes,
        clock=a.clock or "cost",
        cost_profile=a.cost_profile,
        lane_cap=lane_cap(a),
    )


def check_cost_profile(parser, a) -> None:
    """--cost-profile: the cost clock's, and a file that is one (said before the UI starts)."""
    if a.cost_profile is None:
        return
    if a.clock == "wall":
        parser.error("--cost-profile is the cost clock's: drop it, or --clock wall")
    from tinyllm.race.cost import CHOICES, CostModel

    if a.cost_profile in CHOICES:
        return
    try:
        CostModel.load(a.cost_profile)
    except ValueError as e:
        parser.error(f"--cost-profile: {e}")


def check_lane_pools(parser, a, lanes, work, max_len: int) -> None:
    """A paged lane's pool of --kv-blocks (or its blocks=) must hold each request alone: the rule
    the race applies per request once the model is loaded (``BlockPool.check_fits``), said here
    before the UI starts instead of closing it. (No pool under a KV budget: it buys its blocks.)"""
    from tinyllm.kv.blocks import BlockPool

    longest = max((len(ids) + new for _, ids, new, _, _ in work), default=0)
    for lane in lanes:
        paged = lane.kind == "chunked" or (lane.kind == "continuous" and lane.kv == "paged")
        blocks = lane.kv_blocks or a.kv_blocks
        if not paged or blocks is None or lane.kv_mib is not None or a.kv_memory is not None:
            continue
        pool = BlockPool(1, blocks, lane.block_size or a.block_size, max_len)
        try:
            pool.check_fits(longest)
        except ValueError as e:
            parser.error(
                f"lane {lane.label!r}: {e}: raise {'its blocks=' if lane.kv_blocks else '--kv-blocks'} "
                f"to {pool.blocks_for(longest)}"
            )
