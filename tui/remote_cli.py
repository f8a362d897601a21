"""`tinyllm-tui --replay` and `--attach`: the app over a recording or a running server, with no
local engine and no torch; local arguments are checked before a file is read or a server reached."""

from __future__ import annotations

import sys
from pathlib import Path

from tinyllm.request import RequestSettings, Sampling
from tui.app import TinyLLMApp
from tui.cli_checks import check_terminal, refuse_unused
from tui.screens.picker import read_workload


def attach_app(parser, a) -> TinyLLMApp:
    """--attach: the app over a server (no local engine, no torch). tinyllm serve streams its
    whole state; a vLLM server only its metrics. Local arguments are checked before connecting."""
    from tinyllm.model.config import CheckpointError, load_config_and_tokenizer
    from tinyllm.workload import WorkloadError, resolve_workload
    from tui.runners.attach import AttachRunner
    from tui.runners.server_link import server_url
    from tui.runners.vllm import VllmRunner

    if a.record is not None:
        parser.error("--record records a local engine; to record a server: tinyllm serve --record FILE")
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
    try:
        url = server_url(a.attach)
    except ValueError as e:
        parser.error(f"--attach {a.attach}: {e}")
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
    app = TinyLLMApp(runner, None, model_name=recorded_model(runner.header), panes=a.panes)
    if a.slo is None:  # the recorded run's SLO (checked when the file was read)
        a.slo = header_slo(runner.header)
    return app


def recorded_model(header: dict) -> str:
    """A recording's model as the live app named it: "bundled Shakespeare" where the header's
    name and tokenizer are the shipped checkpoint's, else the name recorded."""
    from tinyllm.model.config import default_model_dir, model_label
    from tui.runners.frames import tokenizer_id

    name = str(header.get("model", "?"))
    bundled = default_model_dir()
    if name == bundled.name and header.get("tokenizer") == tokenizer_id(bundled):
        return model_label(None)
    return name
