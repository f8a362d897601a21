"""``tinyllm tune``: the engine settings that serve a recording's or a workload's requests best
under an SLO, each configuration a what-if lane on the cost clock (race/race.py), the search in
search.py, the answer in report.py."""

from __future__ import annotations

import json
import sys

from tinyllm.args import (
    UsageError,
    add_cost_profile_arg,
    add_slo_arg,
    output_path,
    positive_float,
    positive_int,
    refuse_writing_over,
)
from tinyllm.config import ONE_THREAD
from tinyllm.engine_args import COMMAND_ENGINE_OPTIONS, add_engine_args, add_source_args
from tinyllm.tune.search import OBJECTIVES
from tinyllm.tune.space import SETTINGS

TUNE_HELP = (
    "search engine settings (concurrency cap, token budget, chunked prefill, prefix cache, block "
    "size, policy, KV dtype) for the ones that serve a recording or a workload best under an SLO"
)


def add_tune_args(tu) -> None:
    """Every option of ``tinyllm tune`` (and of ``tinyllm-tui --tune``, its live view)."""
    add_source_args(tu)
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
    add_cost_profile_arg(tu)
    # threads: the cost profile's calibration and the wall-clock check run one (docs/tune.md)
    add_engine_args(tu, *COMMAND_ENGINE_OPTIONS["tune"], threads=ONE_THREAD)


def cmd_tune(args) -> None:
    """Search, report, check on the wall clock, and write the JSON."""
    from rich.console import Console

    from tinyllm.observe.recording import write_text
    from tinyllm.tune.report import answer_json, print_answer
    from tinyllm.tune.session import execute, prepare

    refuse_writing_over("--json", args.json, args.source)
    session = prepare(args)
    done = [0]
    with Console(stderr=True).status("tuning…") as status:
        phase = [""]

        def on_phase(text: str) -> None:
            phase[0] = text
            status.update(f"tuning: {text}…")

        def on_done(o) -> None:
            done[0] += 1
            status.update(f"tuning: {phase[0]}: {done[0]} runs done (this round on {o.requests} requests)")

        answer = execute(session, on_done, on_phase)
    out = Console() if sys.stdout.isatty() else Console(width=160)  # piped: wide, no column folded
    print_answer(session, answer, out)
    if args.json:
        try:
            write_text(args.json, json.dumps(answer_json(session, answer), indent=1))
        except OSError as e:
            raise UsageError(f"--json {args.json}: cannot write it: {e.strerror or e}") from None
        print(f"wrote {args.json}", file=sys.stderr)
