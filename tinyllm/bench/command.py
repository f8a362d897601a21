"""``tinyllm bench``'s command line: its own options, the engine's shared ones (``--slots``,
``--kv-memory``, ``--max-num-seqs``, ...: one definition and default in tinyllm/engine_args.py), and the
entry point that turns a refusal into one line."""

from __future__ import annotations

from tinyllm.args import add_slo_arg
from tinyllm.bench.run import run_bench
from tinyllm.bench.workloads import LONG_TAIL, LONG_TAIL_CAPS, SHARED_PREFIX
from tinyllm.config import DEFAULT_SLOTS
from tinyllm.engine import DEFAULT_MAX_BATCHED_TOKENS
from tinyllm.engine_args import COMMAND_ENGINE_OPTIONS, add_engine_args, add_model_args
from tinyllm.request import DEFAULT_MAX_NUM_SEQS

PATHS = ["slots", "paged", "chunked", "chunked-nocache", "all"]


BENCH_HELP = "compare solo, static, continuous (slots/paged) and transformers"


def add_bench_args(b) -> None:
    """Every option of ``tinyllm bench``."""
    from tinyllm.args import output_path, positive_int

    src = b.add_mutually_exclusive_group()
    src.add_argument(
        "--random-model",
        nargs="?",
        const="",
        metavar="SPEC",
        help="a seeded random Llama: e.g. layers=4,d_model=256,heads=4,kv_heads=2,vocab=4096 (the default)",
    )
    add_model_args(b, model_group=src)  # (after --random-model: usage shows the two as alternatives)
    b.add_argument(
        "--workload",
        metavar="FILE|NAME",
        help="a JSONL prompt file or a bundled workload's name (greedy, all at t=0), or "
        f"'{SHARED_PREFIX}': {{--requests}} requests sharing a 192-token prefix, or "
        f"'{LONG_TAIL}[-CAP]': ~128-token prompts, output lengths exponential (mean 128) "
        f"capped at CAP ({' / '.join(map(str, LONG_TAIL_CAPS))}, default {LONG_TAIL_CAPS[-1]}), EOS ignored",
    )
    b.add_argument(
        "--requests",
        type=positive_int,
        default=64,
        metavar="N",
        help="seeded workload size (64): the default, shared-prefix and long-tail workloads",
    )
    b.add_argument("--batch", type=positive_int, default=16, metavar="N", help="static / transformers batch size")
    b.add_argument(
        "--paths",
        choices=PATHS,
        default="all",
        help="continuous path(s) to run: slot KV, paged KV, paged KV with the token-budget "
        "scheduler (chunked prefill) and prefix caching, the same without the cache, or all (default)",
    )
    b.add_argument("--solo-sample", type=positive_int, default=8, metavar="N", help="requests run solo (default 8)")
    b.add_argument("--no-transformers", action="store_true", help="skip the transformers comparison")
    b.add_argument("--seed", type=int, default=0, metavar="S", help="the seed its workloads are drawn with (default 0)")
    b.add_argument("--json", type=output_path, metavar="OUT", help="also write the figures as JSON")
    # The engine's options (their one definition): --slots is every path's sequences in the
    # equal-slots table; --kv-memory the headline table's budget for every path (default: what
    # --slots slots of max_len reserve).
    add_engine_args(b, *COMMAND_ENGINE_OPTIONS["bench"])
    add_slo_arg(b)  # each path's goodput and share met (every request arrives at t=0)


def cmd_bench(args) -> None:
    from tinyllm.args import UsageError, option_names
    from tinyllm.model.checkpoint import CheckpointError

    args.slots = args.slots or DEFAULT_SLOTS  # (EngineConfig's defaults, filled in)
    args.max_num_seqs = args.max_num_seqs or DEFAULT_MAX_NUM_SEQS
    args.max_batched_tokens = args.max_batched_tokens or DEFAULT_MAX_BATCHED_TOKENS

    try:
        run_bench(args)
    except (ValueError, CheckpointError) as e:
        raise UsageError(
            option_names(str(e), *((name, name) for name in ("max_len", "kv_blocks", "block_size")))
        ) from None  # (the bench has no such options: their names stay)
