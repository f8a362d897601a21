"""The command line's shared checks: each one refuses what the user got wrong in one line
(``parser.error``: stderr, exit 2) before any screen or process starts, without torch."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tinyllm.args import UsageError, check_new_file, option_names
from tinyllm.engine_args import COMMAND_ENGINE_OPTIONS
from tinyllm.request import DEFAULT_MAX_BATCHED_TOKENS


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
        {"race", "lanes", "batch_timeout", "model", "paused", "step_delay", "engine_thread"}
        | set(COMMAND_ENGINE_OPTIONS["race"]),
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


def model_config(parser, a):
    """--model, checked without torch: (checkpoint dir, its config, its tokenizer)."""
    from tinyllm.model.config import CheckpointError, default_model_dir, load_config_and_tokenizer

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
    it would overwrite a recording (tinyllm serve --record's own rule)."""
    try:
        check_new_file("--record", path)
    except UsageError as e:
        parser.error(str(e))


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
