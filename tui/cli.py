"""`tinyllm-tui`: the command line. Parse and check every option once, before any screen or
process starts (one line on stderr, exit 2, for anything the user got wrong), then run the
app in this terminal, or serve it in a browser (--web).

What runs is decided here: the main app over a local engine (a child process, or a thread),
a recording (--replay), a server (--attach), the race (--race), or a tuning session watched live
(--tune: tinyllm tune's options, tui/tune_app.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tinyllm.args import MAX_NUM_SEQS_WITHOUT_KV_MEMORY, SLOTS_WITH_KV_MEMORY, option_names
from tinyllm.config import EngineConfig
from tinyllm.request import ContextTooLong, RequestSettings, Sampling, check_fits
from tui import web
from tui.cli_checks import check_max_len, check_pool, check_terminal, check_writable, model_config, scheduler_choice
from tui.cli_parser import build_parser, parse
from tui.race_cli import race_app, race_spec
from tui.runners.child import ChildRunner, EngineStartError
from tui.runners.engine_spec import EngineSpec
from tui.runners.interface import MAX_DELAY_MS

if TYPE_CHECKING:  # (Textual loads only once the arguments are checked: a typo is refused at once)
    from tui.app import TinyLLMApp

__all__ = ["build_app", "build_parser", "main", "parse", "race_spec", "serve_if_asked", "with_slo"]


def build_app(argv: list[str] | None = None, require_terminal: bool = False) -> TinyLLMApp:
    """Parse arguments, check them, start the engine; SystemExit(2) with one line on bad input.

    Everything the user can get wrong is checked here, before the screen takes over, without
    importing torch: the checkpoint's config and tokenizer, the settings, and the prompt file.
    The engine process then loads torch and the weights while the screen is already up (its
    errors, e.g. unreadable weights, end the app with the same kind of one line)."""
    from tinyllm.model.config import CheckpointError, model_label
    from tinyllm.workload import WorkloadError, resolve_workload

    parser = build_parser()
    a = parse(parser, argv)
    from tui.app import TinyLLMApp
    from tui.remote_cli import attach_app, replay_app
    from tui.screens.picker import read_workload

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
        parser.error(MAX_NUM_SEQS_WITHOUT_KV_MEMORY)
    if a.prefix_cache and not chunked:
        parser.error("--prefix-cache needs chunked prefill (the token-budget scheduler on --kv paged)")
    if kv == "paged" and a.kv_blocks is not None:
        check_pool(parser, a.kv_blocks, a.block_size, max_len)
    check_terminal(parser, a)
    config = EngineConfig.from_args(a, kv=kv, chunked_prefill=chunked, max_len=max_len)
    spec = EngineSpec(str(path), config, record=a.record, slo=None if a.slo is None else str(a.slo))
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
    name = model_label(a.model)
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


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else list(argv)
    if "--tune" in given:  # tinyllm tune's options, watched live (tui/tune_app.py)
        from tui.tune_cli import main as tune_main

        return tune_main([a for a in given if a != "--tune"])
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


if __name__ == "__main__":  # (the command, tinyllm-tui, is tui.launch: it keeps a typed Enter first)
    sys.exit(main())
