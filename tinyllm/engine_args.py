"""The command-line options that build an engine, each defined once: the engine's settings
(``engine_options``; which command offers which: ``COMMAND_ENGINE_OPTIONS``), the model
(``--model``, ``--device``) and what whatif and tune replay. ``EngineConfig.from_args`` reads
them back (tinyllm/config.py). No torch."""

from __future__ import annotations

import argparse
import re

from tinyllm.args import device_arg, kv_dtype_arg, positive_float, positive_int


def speculative_arg(text: str) -> dict:
    """--speculative-config JSON, checked as the engine takes it (engine/speculate.py)."""
    from tinyllm.config import speculative_settings

    try:
        return speculative_settings(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# -- the engine's options: each defined once, for every command that takes it ----------------------
# tinyllm-tui takes every one, the other commands those COMMAND_ENGINE_OPTIONS lists, with
# add_engine_args(parser, *names); the defaults are EngineConfig's (tinyllm/config.py). Sizes
# default to None ("not given") so a command can tell a typed value from a recording's or a
# lane's; fill_engine_defaults() puts EngineConfig's in where nothing else decides.


def engine_options() -> dict[str, tuple[tuple[str, ...], dict]]:
    """name -> (flags, argparse keywords): the one definition of each engine option."""
    from tinyllm.config import DEFAULT_BLOCK_SIZE, DEFAULT_SLOTS, DEFAULT_THREADS
    from tinyllm.request import DEFAULT_MAX_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS, SCHEDULING_POLICIES

    size = dict(type=positive_int, default=None, metavar="N")
    return {
        "slots": (
            ("--slots",),
            dict(
                size,
                help=f"requests that run at once without a KV budget, each with a KV slot "
                f"or its share of the pool (default {DEFAULT_SLOTS})",
            ),
        ),
        "kv_memory": (
            ("--kv-memory",),
            dict(
                type=positive_float,
                default=None,
                metavar="MiB",
                help="the KV memory budget, instead of --slots: slot KV gets the slots of --max-len it buys, "
                "paged KV the blocks it buys, run by up to --max-num-seqs requests (vLLM's way)",
            ),
        ),
        "max_num_seqs": (
            ("--max-num-seqs",),
            dict(size, help=f"with --kv-memory: the cap on running requests (default {DEFAULT_MAX_NUM_SEQS})"),
        ),
        "max_len": (
            ("--max-len",),
            dict(size, help="prompt + output tokens per request (default: the model's context)"),
        ),
        "kv": (
            ("--kv",),
            dict(
                choices=["slots", "paged"],
                default=None,
                help="KV cache layout: slots (every request reserves --max-len tokens) or paged (blocks follow "
                "real use)",
            ),
        ),
        "chunked_prefill": (
            ("--chunked-prefill",),
            dict(
                action=argparse.BooleanOptionalAction,
                default=None,
                help="the token-budget scheduler: decodes and prompt chunks in one forward per step "
                "(--no-chunked-prefill: prefill, then decode)",
            ),
        ),
        "prefix_cache": (
            ("--prefix-cache",),
            dict(
                action=argparse.BooleanOptionalAction,
                default=None,
                help="reuse the KV blocks of prompt prefixes seen before (default on with chunked prefill)",
            ),
        ),
        "max_batched_tokens": (
            ("--max-batched-tokens",),
            dict(
                size,
                help=f"chunked prefill: tokens per step, "
                f"decodes and prompt chunks, at least the running requests (default "
                f"{DEFAULT_MAX_BATCHED_TOKENS})",
            ),
        ),
        "block_size": (
            ("--block-size",),
            dict(size, help=f"paged: tokens per KV block (default {DEFAULT_BLOCK_SIZE})"),
        ),
        "kv_blocks": (
            ("--kv-blocks",),
            dict(
                size, help="paged: blocks in the pool (default: the memory of the slots); small values force preemption"
            ),
        ),
        "scheduling_policy": (
            ("--scheduling-policy",),
            dict(
                choices=SCHEDULING_POLICIES,
                default="fcfs",
                metavar="POLICY",
                help=f"the waiting queue's order and whom to preempt: {', '.join(SCHEDULING_POLICIES)} "
                "(default fcfs; priority: lower first, may preempt; fair: shares the token budget "
                "between tenants)",
            ),
        ),
        "device": (
            ("--device",),
            dict(
                type=device_arg,
                default=None,
                metavar="DEVICE",
                help="cpu, cuda or cuda:N (default: cuda when available)",
            ),
        ),
        "threads": (
            ("--threads",),
            # (a command with another default gives it to add_engine_args: the help shows it)
            dict(
                type=positive_int, default=DEFAULT_THREADS, metavar="N", help="torch CPU threads (default %(default)s)"
            ),
        ),
        "seed": (
            ("--seed",),
            dict(
                type=int,
                default=0,
                metavar="S",
                help="sampling seed (default 0): the same seed, the same text (a request's own seed wins)",
            ),
        ),
        "kv_cache_dtype": (
            ("--kv-cache-dtype",),
            dict(
                type=kv_dtype_arg,
                default="auto",
                metavar="DTYPE",
                help="the KV cache's element type: auto (the model's: float32 on CPU), float32, or "
                "bfloat16 (half the KV memory per token: twice the sequences a --kv-memory budget "
                "buys, half the bytes attention reads; greedy text can differ from float32's)",
            ),
        ),
        "speculative_config": (
            ("--speculative-config",),
            dict(
                type=speculative_arg,
                default=None,
                metavar="JSON",
                help='speculative decoding, vLLM\'s JSON: \'{"method": "ngram", "num_speculative_tokens": 4, '
                '"prompt_lookup_max": 3}\' (prompt lookup) or \'{"method": "draft_model", "model": '
                '"tinyllm-shakespeare-draft", "num_speculative_tokens": 4}\' (a draft model: a checkpoint directory '
                "with the model's tokenizer, or the bundled model's draft); greedy and unseeded sampled requests; "
                'needs the token budget; off from "disable_by_batch_size" decoding requests, default 4',
            ),
        ),
    }


# The engine options each command takes, beside their definitions: a new setting is offered by
# adding it here (tinyllm-tui takes every one; the benchmark scripts, python -m tui.bench_app and
# python -m tinyllm.serve.loadtest, take --slots and --threads). The server always runs paged KV
# with the token budget; whatif's and bench's lanes set the layout and scheduler themselves.
COMMAND_ENGINE_OPTIONS = {
    "serve": (
        "speculative_config",
        "slots",
        "kv_memory",
        "max_num_seqs",
        "max_len",
        "kv_blocks",
        "block_size",
        "max_batched_tokens",
        "prefix_cache",
        "scheduling_policy",
        "kv_cache_dtype",
        "seed",
        "threads",
    ),
    "whatif": (
        "speculative_config",
        "slots",
        "max_len",
        "block_size",
        "kv_blocks",
        "kv_memory",
        "max_num_seqs",
        "max_batched_tokens",
        "kv_cache_dtype",
        "threads",
    ),
    "bench": (
        "speculative_config",
        "slots",
        "kv_memory",
        "max_num_seqs",
        "max_batched_tokens",
        "scheduling_policy",
        "kv_cache_dtype",
        "threads",
    ),
    "tune": ("kv_memory", "max_len", "threads"),
    "train": ("threads",),
    "generate": ("seed",),
    # tinyllm-tui --race (the app refuses the rest in that mode)
    "race": (
        "device",
        "slots",
        "kv_memory",
        "max_num_seqs",
        "max_len",
        "max_batched_tokens",
        "threads",
        "block_size",
        "kv_blocks",
        "kv_cache_dtype",
        "seed",
    ),
}


def add_engine_args(p: argparse.ArgumentParser, *names: str, **own_defaults) -> None:
    """Add the engine options ``names`` (engine_options' keys) to a command's parser;
    ``own_defaults``: a command's own default for some (its --help says that one)."""
    options = engine_options()
    for name in names:
        flags, kwargs = options[name]
        if name in own_defaults:
            value = own_defaults[name]
            help_ = re.sub(r"\(default [^)%]*\)", f"(default {value})", kwargs["help"])  # (%(default)s: argparse's)
            kwargs = {**kwargs, "default": value, "help": help_}
        p.add_argument(*flags, dest=name, **kwargs)


def lane_cap(args: argparse.Namespace) -> int | None:
    """--max-num-seqs where there is no --kv-memory: the cap of the race lanes with a KV budget of
    their own (``kv_mib=``); with --kv-memory the run's config holds it (build_race's lane_cap)."""
    return args.max_num_seqs if args.kv_memory is None else None


def fill_engine_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """EngineConfig's defaults for the sizes a command line left out (those it has)."""
    from tinyllm.config import DEFAULT_BLOCK_SIZE, DEFAULT_SLOTS

    for name, default in (("slots", DEFAULT_SLOTS), ("block_size", DEFAULT_BLOCK_SIZE)):
        if getattr(args, name, default) is None:
            setattr(args, name, default)
    return args


# -- the model and the source of requests -------------------------------------------------------


def add_model_args(p: argparse.ArgumentParser, model_group=None) -> None:
    """--model (into ``model_group`` where a command offers another source, as bench's
    --random-model) and --device."""
    (model_group or p).add_argument(
        "--model",
        metavar="DIR",
        help="local Hugging Face Llama checkpoint directory "
        "(config.json, safetensors, tokenizer.json); default: the bundled Shakespeare model",
    )
    add_engine_args(p, "device")


def add_source_args(p: argparse.ArgumentParser) -> None:
    """What ``tinyllm whatif`` and ``tinyllm tune`` run: a recording or a workload, the model
    that runs it, and the output length of a workload line that names none."""
    from tinyllm.workload import NEW_TOKENS

    add_model_args(p)
    p.add_argument(
        "source",
        metavar="RUN.jsonl|WORKLOAD",
        help="a recording (tinyllm-tui --record, or a server's /v1/tinyllm/stream saved with curl -N), "
        "a workload file, or a bundled workload's name (e.g. poisson_arrivals, long_tail)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"for a workload line without max_new_tokens ({NEW_TOKENS}; not a cap: a line's own wins)",
    )
