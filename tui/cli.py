"""`tinyllm-tui`: the command line. Parse and check every option once, before any screen or
process starts (one line on stderr, exit 2, for anything the user got wrong), then run the
app in this terminal, or serve it in a browser (--web).

What runs is decided here: the main app over a local engine (a child process, or a thread),
a recording (--replay), a server (--attach), or the race (--race).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tinyllm.args import (
    SLOTS_WITH_KV_MEMORY,
    add_engine_args,
    add_slo_arg,
    check_device,
    engine_options,
    fill_engine_defaults,
    option_names,
)
from tinyllm.race.rules import DEFAULT_BATCH_TIMEOUT_S, DEFAULT_MAX_LEN, DEFAULT_WORKLOAD, check_static_batches
from tinyllm.race.views import LANES
from tinyllm.request import DEFAULT_MAX_BATCHED_TOKENS, ContextTooLong, RequestSettings, Sampling, check_fits
from tui import web
from tui.app import DEFAULT_THREADS, TinyLLMApp
from tui.runners.child import ChildRunner, EngineStartError
from tui.runners.engine import EngineSpec
from tui.runners.interface import MAX_DELAY_MS
from tui.screens.picker import read_workload

ENGINE_OPTION_NAMES = tuple(engine_options())  # every engine option: the app runs an engine of its own
ATTACH_WAIT_S = 60.0  # --attach: how long to wait for a server to listen (vLLM-CPU loads in ~30-60 s)


def build_parser() -> argparse.ArgumentParser:
    from tinyllm.args import OneLineParser, non_negative_float, positive_int, unit_interval

    p = OneLineParser(
        prog="tinyllm-tui",
        description="Watch tinyllm's continuous-batching scheduler live: "
        "type prompts or load prompt files, see slots, KV blocks and tokens as they happen.",
    )
    p.add_argument("--model", metavar="DIR", help="local HF Llama checkpoint directory (default: bundled Shakespeare)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available, else cpu)")
    add_engine_args(p, *ENGINE_OPTION_NAMES)  # (the app's engine: paged KV and chunked prefill unless told)
    p.add_argument(
        "--threads",
        type=positive_int,
        default=DEFAULT_THREADS,
        metavar="N",
        help=f"torch CPU threads for the engine (default {DEFAULT_THREADS}: see the README on contention)",
    )
    p.add_argument(
        "--temperature",
        type=non_negative_float,
        default=0.8,
        metavar="T",
        help="default for new requests (0 = greedy; default 0.8)",
    )
    p.add_argument(
        "--top-k", type=positive_int, default=None, metavar="K", help="default top_k for new requests (default off)"
    )
    p.add_argument(
        "--top-p", type=unit_interval, default=None, metavar="P", help="default top_p for new requests (default off)"
    )
    p.add_argument(
        "--max-new-tokens", type=positive_int, default=120, metavar="N", help="default for new requests (default 120)"
    )
    p.add_argument(
        "--prompts",
        default=None,
        metavar="FILE|NAME",
        help="a JSONL workload to load at start: a path, or a bundled workload's name (e.g. burst)",
    )
    p.add_argument("--seed", type=int, default=0, metavar="S", help="sampling seed (default 0)")
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


def scheduler_choice(parser, kv: str | None, chunked: bool | None, budget: int | None, slots: int) -> tuple[str, bool]:
    """(kv, chunked_prefill) from the flags: chunked prefill on the paged cache unless told
    otherwise; contradictions are errors that say which flags clash."""
    if chunked and kv == "slots":
        parser.error("--chunked-prefill needs --kv paged (the token-budget scheduler allocates KV blocks)")
    kv = kv or "paged"
    chunked = (kv == "paged") if chunked is None else chunked
    if budget is not None and not chunked:
        parser.error("--max-batched-tokens applies to chunked prefill only (drop --no-chunked-prefill / --kv slots)")
    if chunked and (budget or DEFAULT_MAX_BATCHED_TOKENS) < slots:
        parser.error(
            f"--max-batched-tokens {budget or DEFAULT_MAX_BATCHED_TOKENS} is less than --slots {slots}: "
            f"every running request decodes one token per step, so the budget must cover them all"
        )
    return kv, chunked


def parse(parser, argv: list[str] | None):
    """The options, plus ``given``: the dests the command line set. The same parse again, over a
    namespace that already holds a marker for each, keeps the marker where nothing was typed (an
    option left at its default is not given, one typed at its default value is)."""
    a = parser.parse_args(argv)
    unset = object()
    typed = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(vars(a), unset)))
    a.given = {dest for dest, value in vars(typed).items() if value is not unset}
    return fill_engine_defaults(a)


# What each mode besides the local engine uses, by dest, and why the rest does not apply: any
# other option given with it is refused (one line, exit 2), never silently ignored. (The modes'
# own refusals, with reasons of their own, come first; --web, --host and --port go with any mode.)
MODE_USES = {
    "--replay": (
        "a replay shows the recorded run: no model, no engine, no new requests",
        {"replay", "paused", "step_delay", "panes", "slo"},  # (--slo: judged against another SLO)
    ),
    "--attach": (
        "the server runs its own engine, at its own settings and pace",
        {
            "attach",
            "panes",
            "api_key",
            "kv_events",
            "wait",
            "model",
            "prompts",
            "temperature",
            "top_k",
            "top_p",
            "max_new_tokens",
        },
    ),
    "--race": (
        "the race is greedy, and each request's max_new_tokens comes from its workload",
        {
            "race",
            "lanes",
            "batch_timeout",
            "model",
            "device",
            "slots",
            "kv_memory",
            "max_num_seqs",
            "max_len",
            "max_batched_tokens",
            "threads",
            "block_size",
            "kv_blocks",
            "seed",
            "kv_cache_dtype",
            "paused",
            "step_delay",
            "engine_thread",
        },
    ),
}
ANY_MODE = {"web", "host", "port", "web_sessions"}


def refuse_unused(parser, a, mode: str) -> None:
    """Refuse the first option given on the command line that ``mode`` does not use."""
    why, uses = MODE_USES[mode]
    for dest in vars(a):  # in --help's order
        if dest in a.given and dest not in uses | ANY_MODE:
            flag = "--" + ("no-" if getattr(a, dest) is False else "") + dest.replace("_", "-")
            parser.error(f"{flag} does not apply to {mode} ({why})")


def build_app(argv: list[str] | None = None, require_terminal: bool = False) -> TinyLLMApp:
    """Parse arguments, check them, start the engine; SystemExit(2) with one line on bad input.

    Everything the user can get wrong is checked here, before the screen takes over, without
    importing torch: the checkpoint's config and tokenizer, the settings, and the prompt file.
    The engine process then loads torch and the weights while the screen is already up (its
    errors, e.g. unreadable weights, end the app with the same kind of one line)."""
    from tinyllm.model.config import CheckpointError
    from tinyllm.workload import WorkloadError, resolve_workload

    parser = build_parser()
    a = parse(parser, argv)
    a.require_terminal = require_terminal  # (main: once the arguments are checked, before any work)
    if not 0 <= a.step_delay <= MAX_DELAY_MS:
        parser.error(f"--step-delay must be in [0, {MAX_DELAY_MS}] ms, got {a.step_delay}")
    if (race := race_app(parser, a)) is not None:
        return race
    if a.scheduling_policy != "fcfs" and (a.replay is not None or a.attach is not None):
        parser.error(
            "--scheduling-policy applies to the app's own engine (a replay shows the recorded one; "
            "a server has its own: tinyllm serve --scheduling-policy)"
        )
    if a.replay is not None and a.attach is not None:
        parser.error(
            "--replay and --attach cannot be used together: a replay shows a recorded run, --attach a live server"
        )
    if a.replay is not None:
        return with_slo(replay_app(parser, a), a)
    if a.attach is not None:
        return with_slo(attach_app(parser, a), a)
    if a.kv_events is not None:
        parser.error("--kv-events applies to --attach (a vLLM server's KV-cache events)")
    if "wait" in a.given:
        parser.error("--wait applies to --attach (how long to wait for the server to listen)")
    if a.api_key is not None:
        parser.error("--api-key applies to --attach (a tinyllm serve's key)")
    if a.record is not None:
        check_writable(parser, a.record)
    path, cfg, tok = model_config(parser, a)
    max_len = a.max_len or cfg.max_seq_len
    check_max_len(parser, max_len, cfg)
    try:
        check_fits(1, a.max_new_tokens, max_len, "--max-len")
    except ContextTooLong:
        parser.error(f"--max-new-tokens {a.max_new_tokens} leaves no room for a prompt in --max-len {max_len}")
    try:
        sampling = Sampling(a.temperature, a.top_k, a.top_p)
    except ValueError as e:
        parser.error(str(e))
    prompts = None
    if a.prompts is not None:
        try:
            prompts = resolve_workload(a.prompts)
            read_workload(prompts, tok.encode, max_len, a.max_new_tokens)
        except WorkloadError as e:
            parser.error(f"--prompts: {e}")
    kv, chunked = scheduler_choice(parser, a.kv, a.chunked_prefill, a.max_batched_tokens, a.slots)
    for flag, dest in (("--kv-blocks", "kv_blocks"), ("--block-size", "block_size")):
        if kv == "slots" and dest in a.given:
            parser.error(
                f"{flag} goes with --kv paged (the slot cache has no blocks: each slot holds --max-len tokens)"
            )
    if a.kv_memory is not None and a.kv_blocks is not None:
        parser.error("--kv-memory sizes the KV pool: drop --kv-blocks")
    if a.kv_memory is not None and "slots" in a.given:
        parser.error(SLOTS_WITH_KV_MEMORY)
    if a.max_num_seqs is not None and a.kv_memory is None:
        parser.error("--max-num-seqs goes with --kv-memory (without a budget, --slots is the cap)")
    if a.prefix_cache and not chunked:
        parser.error("--prefix-cache needs chunked prefill (the token-budget scheduler on --kv paged)")
    if kv == "paged" and a.kv_blocks is not None:
        check_pool(parser, a.kv_blocks, a.block_size, max_len)
    check_terminal(parser, a)
    spec = EngineSpec(
        str(path),
        a.device,
        a.slots,
        max_len,
        kv,
        a.block_size,
        a.kv_blocks,
        a.seed,
        threads=a.threads,
        chunked_prefill=chunked,
        max_batched_tokens=a.max_batched_tokens,
        prefix_cache=a.prefix_cache,
        record=a.record,
        scheduling_policy=a.scheduling_policy,
        kv_memory_mib=a.kv_memory,
        max_num_seqs=a.max_num_seqs,
        kv_cache_dtype=a.kv_cache_dtype,
        slo=None if a.slo is None else str(a.slo),
    )
    try:
        if a.engine_thread:
            from tui.runners.engine import EngineRunner

            engine, _ = spec.build()
            runner = EngineRunner(
                engine, tok, paused=a.paused, step_delay_ms=a.step_delay, recorder=spec.open_recorder(engine)
            )
        else:
            runner = ChildRunner(spec, paused=a.paused, step_delay_ms=a.step_delay).start(wait=False)
    except CheckpointError as e:
        parser.error(f"--model: {e}")
    except Exception as e:  # noqa: BLE001 - e.g. CUDA errors with --engine-thread
        parser.error(
            option_names(str(e))
            if isinstance(e, (ValueError, EngineStartError))
            else f"the engine could not start: {type(e).__name__}: {' '.join(str(e).split())}"
        )
    name = path.name if a.model else "bundled Shakespeare"
    return with_slo(
        TinyLLMApp(
            runner,
            tok,
            model_name=name,
            settings=RequestSettings(sampling, a.max_new_tokens),
            prompts_file=prompts,
            recording=Path(a.record) if a.record else None,
            panes=a.panes,
        ),
        a,
    )


def with_slo(app: TinyLLMApp, a) -> TinyLLMApp:
    """The app with --slo: its counters and request rows judge each ended request against it."""
    app.slo = a.slo
    return app


def model_config(parser, a):
    """--device and --model, checked without torch: (checkpoint dir, its config, its tokenizer)."""
    from tinyllm.model.config import CheckpointError, default_model_dir, load_config_and_tokenizer

    check_device(parser, a.device)
    path = Path(a.model) if a.model else default_model_dir()
    try:
        cfg, tok = load_config_and_tokenizer(path)
    except CheckpointError as e:
        parser.error(f"--model: {e}")
    return path, cfg, tok


def check_max_len(parser, max_len: int, cfg) -> None:
    """--max-len: at most the model's context (the engine's rule, said before the screen is up)."""
    if max_len > cfg.max_seq_len:
        parser.error(f"--max-len {max_len} is more than the model's context ({cfg.max_seq_len})")


def check_pool(parser, kv_blocks: int, block_size: int, max_len: int) -> None:
    """--kv-blocks: a pool that cannot hold one request of --max-len would refuse most prompts, so
    it is refused now, by tinyllm serve's own rule (plain Python: no torch, no server imports)."""
    from tinyllm.kv.blocks import check_pool_holds_one_request

    try:
        check_pool_holds_one_request(kv_blocks, block_size, max_len)
    except ValueError as e:
        parser.error(option_names(str(e)))


def check_writable(parser, path: str) -> None:
    """--record: say now, before the screen is up, if the file cannot be written, or if writing
    it would overwrite a recording (an empty file is fair game: nothing to lose)."""
    p = Path(path)
    if not path.strip():
        parser.error("--record needs a file name, e.g. --record run.jsonl")
    if p.is_dir():
        parser.error(f"--record {path}: is a directory; give a file name, e.g. {p / 'run.jsonl'}")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        parser.error(f"--record {path}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        parser.error(f"--record {path}: not writable")
    if p.exists() and p.stat().st_size > 0:
        parser.error(
            f"--record {path}: the file exists ({p.stat().st_size:,} bytes) and would be overwritten; "
            f"choose another name or remove it"
        )
    existed = p.exists()
    try:  # what access() cannot tell (/proc, a full disk, ...)
        open(p, "a").close()
        if not existed:
            p.unlink()
    except OSError as e:
        parser.error(f"--record {path}: cannot write it ({e.strerror or e})")


def attach_app(parser, a) -> TinyLLMApp:
    """--attach: the app over a server (no local engine, no torch). tinyllm serve streams its
    whole state; a vLLM server only its metrics. Local arguments are checked before connecting."""
    from tinyllm.model.config import CheckpointError, load_config_and_tokenizer
    from tinyllm.workload import WorkloadError, resolve_workload
    from tui.runners.attach import AttachRunner
    from tui.runners.vllm import VllmRunner

    if a.record is not None:
        parser.error("--record records a local engine; to record a server: curl -N URL/v1/tinyllm/stream > run.jsonl")
    refuse_unused(parser, a, "--attach")
    if a.prompts is not None and not a.model:
        parser.error(
            "--prompts with --attach needs --model DIR: its tokenizer checks the prompt file "
            "(F3 loads prompt files the same way)"
        )
    try:
        sampling = Sampling(a.temperature, a.top_k, a.top_p)
    except ValueError as e:
        parser.error(str(e))
    tok = None
    if a.model:  # for prompt files and local fit checks
        try:
            _, tok = load_config_and_tokenizer(Path(a.model))
        except CheckpointError as e:
            parser.error(f"--model: {e}")
    url = a.attach if "://" in a.attach else f"http://{a.attach}"
    if url.split("://", 1)[0].lower() not in ("http", "https"):
        parser.error(f"--attach {a.attach}: a server's address is http://HOST:PORT or https://HOST:PORT (or HOST:PORT)")
    kv_events = kv_events_subscriber(parser, a.kv_events) if a.kv_events is not None else None
    check_terminal(parser, a)
    wait_for_server(parser, url, a.wait)
    try:
        runner = AttachRunner(url, api_key=a.api_key).start()
    except ConnectionError as e:
        if "not a tinyllm serve" not in str(e):
            parser.error(f"--attach {e}")
        try:  # no state stream: a vLLM server?
            runner = VllmRunner(url, kv_events=kv_events).start()
        except ConnectionError as e2:
            parser.error(
                f"--attach {url}: found neither tinyllm serve nor a vLLM server there "
                f"({str(e).split(': ', 1)[-1]}; {str(e2).split(': ', 1)[-1]})"
            )
    if kv_events is not None and not isinstance(runner, VllmRunner):
        runner.stop()
        parser.error(f"--kv-events: {url} is tinyllm serve, whose block map the app draws already")
    prompts = None
    if a.prompts is not None:
        try:
            prompts = resolve_workload(a.prompts)
            read_workload(prompts, tok.encode, runner.frame.snapshot.max_len, a.max_new_tokens)
        except WorkloadError as e:
            runner.stop()
            parser.error(f"--prompts: {e}")
    return TinyLLMApp(
        runner,
        tok,
        model_name=runner.model_name,
        settings=RequestSettings(sampling, a.max_new_tokens),
        prompts_file=prompts,
        panes=a.panes,
    )


def wait_for_server(parser, url: str, wait_s: float) -> None:
    """Return once something listens at ``url``, saying on stderr what it waits for (a vLLM server
    takes a minute to load before it listens; so may tinyllm serve on a big checkpoint); after
    ``wait_s`` seconds, one line and exit 2. Ctrl+C stops the wait (main says so)."""
    import math
    import time

    from tui.runners.server_link import not_listening

    deadline = time.monotonic() + wait_s
    tty, told = sys.stderr.isatty(), False
    while True:
        try:
            why = not_listening(url, timeout=2.0)  # (its own time: a slow link is not a dead one)
        except ValueError as e:
            parser.error(f"--attach {url}: {e}")
        if why is None:
            if told and tty:
                print(file=sys.stderr)  # keep the last "waiting" line, end it
            return
        left = deadline - time.monotonic()
        if left <= 0:
            if told and tty:
                print(file=sys.stderr)
            waited = f" after waiting {wait_s:g} s" if wait_s else ""
            parser.error(
                f"--attach {url}: cannot connect ({why}){waited}; is the server running? tinyllm serve "
                f"prints its URL" + ("" if wait_s else "; --wait S waits for one that is starting")
            )
        if tty or not told:  # a terminal: one line, rewritten; a pipe: said once
            line = f"tinyllm-tui: waiting for a server at {url} ({why}): {math.ceil(left)} s left, Ctrl+C to stop"
            print(f"\r{line}  " if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)
            told = True
        time.sleep(min(1.0, max(0.0, left)))


def kv_events_subscriber(parser, endpoint: str):
    """--kv-events: the subscriber (not started), or one line and exit 2 if the optional libraries
    are missing or the endpoint is not one a SUB socket can connect to."""
    try:
        from tui.runners.kv_subscriber import KVEventsSubscriber, check_endpoint
    except ImportError as e:
        parser.error(
            f"--kv-events needs msgspec and pyzmq ({e.name or e} is not installed): pip install 'tinyllm[vllm-events]'"
        )
    try:
        return KVEventsSubscriber(check_endpoint(endpoint))
    except ValueError as e:
        parser.error(f"--kv-events {e}")


def replay_app(parser, a) -> TinyLLMApp:
    """--replay: the app over a recording, no model, no torch."""
    from tinyllm.observe.recording import RecordingError, header_slo
    from tui.runners.replay import ReplayRunner

    if a.record is not None:
        parser.error("--record and --replay cannot be used together (a replay changes nothing to record)")
    refuse_unused(parser, a, "--replay")
    try:
        runner = ReplayRunner(a.replay, paused=a.paused, step_delay_ms=a.step_delay)
    except RecordingError as e:
        parser.error(f"--replay: {e}")
    check_terminal(parser, a)  # (after the recording's own checks: a read, no work)
    app = TinyLLMApp(runner, None, model_name=str(runner.header.get("model", "?")), panes=a.panes)
    if a.slo is None:  # the recorded run's SLO (checked when the file was read)
        a.slo = header_slo(runner.header)
    return app


def main(argv: list[str] | None = None) -> int:
    if (code := serve_if_asked(argv)) is not None:  # --web: the app in a browser, one process per tab
        return code
    try:
        app = build_app(argv, require_terminal=True)
    except KeyboardInterrupt:  # Ctrl+C while waiting for a server or loading
        print("\ntinyllm-tui: stopped before the app started", file=sys.stderr)
        return 130
    app.run()
    if app.startup_error is not None:
        build_parser().error(option_names(app.startup_error))  # one line on stderr, exit 2
    if getattr(app, "recording", None) is not None:  # (a recording cut short before its first step: removed)
        print(app.recording_note())
    return app.return_code or 0


def check_terminal(parser, a) -> None:
    """Refuse, in one line, to go on without a terminal (where the caller is main: tests build
    apps without one). Called once the arguments are checked, before an engine starts, a
    recording is opened or a server is waited for."""
    if getattr(a, "require_terminal", False) and (which := not_a_terminal()) is not None:
        parser.error(
            f"the app draws in a terminal and its {which} is not one (redirected?); run it in a "
            f"terminal, or in a browser with --web"
        )


def not_a_terminal() -> str | None:
    """Which of stdin / stdout is not a terminal (Textual would spin a core reading a closed
    stdin, and draw escape codes into a file), or None. A --web tab's app runs under
    textual-serve's driver, which needs none."""
    if os.environ.get("TEXTUAL_DRIVER"):
        return None
    for name, stream in (("stdin", sys.stdin), ("stdout", sys.stdout)):
        if stream is None or not stream.isatty():
            return name
    return None


def serve_if_asked(argv: list[str] | None) -> int | None:
    """--web: check the options, then serve until Ctrl+C (returns the exit code). Without --web:
    None (the caller runs the app in this terminal), after refusing --host / --port."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    a = parse(parser, argv)
    if not a.web:
        for flag, value in (("--host", a.host), ("--port", a.port), ("--web-sessions", a.web_sessions)):
            if value is not None:
                parser.error(f"{flag} applies to --web only")
        return None
    check_session(parser, a)
    return web.serve(parser, a, [sys.executable, "-m", "tui.cli", *web.session_argv(argv)])


def check_session(parser, a) -> None:
    """--web: what a tab's app would refuse, refused here once instead (no engine started): the
    model, a prompt file, the race's options. Anything else a tab's app reports itself."""
    from tinyllm.model.config import CheckpointError, default_model_dir, load_config_and_tokenizer
    from tinyllm.workload import WorkloadError, resolve_workload

    if a.record is not None:  # every tab would record to the one file
        parser.error(
            "--record with --web: each browser tab runs its own app; record from a terminal (tinyllm-tui --record FILE)"
        )
    if a.replay is not None or a.attach is not None:
        return  # no model: the tab's app checks its own file / server
    if a.race is not None:
        race_spec(parser, a)
        return
    try:
        load_config_and_tokenizer(Path(a.model) if a.model else default_model_dir())
    except CheckpointError as e:
        parser.error(f"--model: {e}")
    if a.prompts is not None:
        try:
            resolve_workload(a.prompts)
        except WorkloadError as e:
            parser.error(f"--prompts: {e}")


# -- the race's options -----------------------------------------------------------------------------
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
    name = Path(a.model).name if a.model else "bundled Shakespeare"
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
    from tinyllm.race.spec import (
        LaneSpecError,
        check_memory_options,
        check_pool_options_used,
        on_recording,
        parse_lanes,
        set_by_options,
    )
    from tinyllm.race.whatif import recorded_settings, requests_from_recording

    try:
        lanes = parse_lanes(a.lanes)  # (at least two lanes: it refuses one)
    except LaneSpecError as e:
        parser.error(f"--lanes: {e}")
    try:
        check_memory_options(lanes, a.kv_memory, a.kv_blocks, a.max_num_seqs)
    except LaneSpecError as e:
        parser.error(str(e))
    if a.kv_memory is not None and "slots" in a.given:
        parser.error(SLOTS_WITH_KV_MEMORY + " (a lane's slots= caps that lane)")
    try:
        recorded = recorded_settings(a.race)  # None: a workload, no settings of its own
    except RecordingError as e:
        parser.error(f"--race: {e}")
    warnings: list[str] = []
    if recorded is not None:  # an option given wins over the recording
        recorded = recorded.without(set_by_options({dest: getattr(a, dest) for dest in a.given}))
        try:
            lanes, warnings = on_recording(lanes, recorded, a.block_size if "block_size" in a.given else None)
        except LaneSpecError as e:
            parser.error(f"--lanes: {e}")
    try:
        check_pool_options_used(lanes, a.kv_blocks, a.block_size if "block_size" in a.given else None)
    except LaneSpecError as e:
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
    return RaceSpec(
        str(path),
        work,
        name,
        a.slots,
        max_len,
        a.block_size,
        a.kv_blocks,
        a.max_batched_tokens,
        timeout,
        lanes,
        a.device,
        a.threads,
        a.seed,
        kv_memory_mib=a.kv_memory,
        max_num_seqs=a.max_num_seqs,
        kv_cache_dtype=a.kv_cache_dtype,
        clock=a.clock or "cost",
        cost_profile=a.cost_profile,
    )


def check_cost_profile(parser, a) -> None:
    """--cost-profile: the cost clock's, and a file that is one (said before the UI starts)."""
    if a.cost_profile is None:
        return
    if a.clock == "wall":
        parser.error("--cost-profile is the cost clock's: drop it, or --clock wall")
    from tinyllm.race.cost import CostModel

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


if __name__ == "__main__":
    sys.exit(main())
