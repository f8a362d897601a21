"""Command-line argument helpers shared by `tinyllm` and `tinyllm-tui`: one-line errors and
checked argument types. No torch, no textual: every command line imports this first.

Every user error is one line on stderr and exit code 2 (``EXIT_USAGE``), never a traceback."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

EXIT_USAGE = 2


class UsageError(Exception):
    """A problem with what the user asked for: printed as one line, exit 2."""


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, and which takes only whole option names:
    argparse's prefix matching read ``--slo`` as ``--slots`` and refused it with a message about slots."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # argparse prints usage + 2 lines by default
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


# The engine's parameter names and the command-line options that set them (the same on the app,
# the server and the race): an engine's refusal is reworded with the options a user typed.
ENGINE_OPTIONS = (
    ("kv_memory_mib", "--kv-memory"),
    ("max_num_seqs", "--max-num-seqs"),
    ("n_slots", "--slots"),
    ("max_len", "--max-len"),
    ("kv_blocks", "--kv-blocks"),
    ("block_size", "--block-size"),
    ("max_batched_tokens", "--max-batched-tokens"),
)


def option_names(message: str, *first: tuple[str, str]) -> str:
    """``message`` (an engine's ValueError) on one line, with its parameter names as the options
    that set them; ``first``: (name, option) pairs instead of the usual ones (a race lane's kv_mib=;
    a command without that option keeps the name)."""
    message = " ".join(message.split())
    named = {name for name, _ in first}
    for name, option in (*first, *(pair for pair in ENGINE_OPTIONS if pair[0] not in named)):
        message = message.replace(name, option)
    return message


def checked(s: str, kind, ok, expected: str):
    """argparse type helper: convert, check, or say what was expected."""
    try:
        v = kind(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {s!r}") from None
    if not ok(v):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {s}")
    return v


# --slots beside --kv-memory was ignored (the budget sizes the cache): every command refuses it in these words.
SLOTS_WITH_KV_MEMORY = (
    "--slots is the number of sequences without a KV budget: with --kv-memory the budget sizes "
    "the cache and --max-num-seqs caps the running sequences (default 64); drop --slots"
)
# and --max-num-seqs without one (the cap it sets is a budget's): in these words.
MAX_NUM_SEQS_WITHOUT_KV_MEMORY = "--max-num-seqs goes with --kv-memory (without a budget, --slots is the cap)"


def positive_int(s: str) -> int:
    return checked(s, int, lambda v: v >= 1, "an integer >= 1")


def positive_float(s: str) -> float:
    """A size such as --kv-memory MiB."""
    return checked(s, float, lambda v: 0 < v < float("inf"), "a finite number > 0")


def non_negative_float(s: str) -> float:
    return checked(s, float, lambda v: 0 <= v < float("inf"), "a finite number >= 0")


def unit_interval(s: str) -> float:
    return checked(s, float, lambda v: 0 < v <= 1, "a number in (0, 1]")


def output_path(s: str) -> str:
    """A file to write at the end of a run (--json, --perfetto): its folder must exist and be
    writable now, so a long run never ends in a traceback for a typo in the path."""
    if not s or os.path.isdir(s):
        raise argparse.ArgumentTypeError(f"expected a file to write, got {s!r}" + (" (a folder)" if s else ""))
    folder = os.path.dirname(os.path.abspath(os.path.expanduser(s)))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"cannot write {s}: no folder {folder}")
    if not os.access(folder, os.W_OK) or (os.path.exists(s) and not os.access(s, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {s}: permission denied")
    return s


def port_number(s: str) -> int:
    """A TCP port; 0 asks the system for any free one."""
    return checked(s, int, lambda v: 0 <= v <= 65535, "a port number in [0, 65535] (0: any free port)")


def device_arg(s: str) -> str:
    """--device: cpu, cuda or cuda:N (whether CUDA is there is checked where torch is loaded)."""
    from tinyllm.config import is_device_name

    if is_device_name(s):
        return s
    raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {s!r}")


def kv_dtype_arg(s: str) -> str:
    """--kv-cache-dtype: auto, float32 or bfloat16 (fp32, bf16: the screen's short names)."""
    from tinyllm.request import kv_dtype_name

    name = kv_dtype_name(s)
    if name is None:
        raise argparse.ArgumentTypeError(f"expected auto, float32 or bfloat16 (fp32, bf16), got {s!r}")
    return name


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
            # a command with another default says so with set_defaults (the help shows it)
            dict(
                type=positive_int, default=DEFAULT_THREADS, metavar="N", help="torch CPU threads (default %(default)s)"
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
    }


# The engine options each command takes, beside their definitions: a new setting is offered by
# adding it here (tinyllm-tui takes every one). The server always runs paged KV with the token
# budget; whatif's and bench's lanes set the layout and scheduler themselves.
COMMAND_ENGINE_OPTIONS = {
    "serve": (
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
        "threads",
    ),
    "whatif": (
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
        "slots",
        "kv_memory",
        "max_num_seqs",
        "max_batched_tokens",
        "scheduling_policy",
        "kv_cache_dtype",
        "threads",
    ),
    "tune": ("kv_memory", "max_len", "threads"),
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
    ),
}


def slo_arg(s: str):
    """--slo: ``ttft=500ms,tpot=50ms`` (tinyllm.slo.SLO), or argparse's one-line error."""
    from tinyllm.slo import SLO

    try:
        return SLO.parse(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_slo_arg(p: argparse.ArgumentParser) -> None:
    """--slo, the same for the app, the race, what-if, the bench and the server."""
    p.add_argument(
        "--slo",
        type=slo_arg,
        default=None,
        metavar="TARGETS",
        help="latency targets per request, e.g. ttft=500ms,tpot=50ms (TTFT; time per output token "
        "after the first; units ms or s): each request is judged met or missed, with the reason it "
        'waited most, and goodput (requests/s that met it) is shown; a workload line\'s "slo" '
        "replaces it for that request",
    )


def add_clock_args(p: argparse.ArgumentParser, scope: str = "") -> None:
    """--clock and --cost-profile: how a race's or a what-if's steps are timed (``scope``: the
    option's prefix in the help, e.g. "--race: ")."""
    p.add_argument(
        "--clock",
        choices=["cost", "wall"],
        default=None,
        help=f"{scope}how a step's time is counted: cost (default: from its work, by a cost model fitted "
        "on this machine once and cached, the same for every lane: the same figures on every run) or "
        "wall (each lane's measured compute)",
    )
    p.add_argument(
        "--cost-profile",
        metavar="FILE",
        default=None,
        help=f"{scope}the cost clock's coefficients from FILE (a profile measured elsewhere, e.g. on a "
        "GPU; default: $TINYLLM_COST_PROFILE, else this machine's)",
    )


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


def fill_engine_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """EngineConfig's defaults for the sizes a command line left out (those it has)."""
    from tinyllm.config import DEFAULT_BLOCK_SIZE, DEFAULT_SLOTS

    for name, default in (("slots", DEFAULT_SLOTS), ("block_size", DEFAULT_BLOCK_SIZE)):
        if getattr(args, name, default) is None:
            setattr(args, name, default)
    return args


# -- what several commands share: the model options, loading it, not writing over an input --------


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


def load_model(args):
    """(model, tokenizer) from --model/--device, or a UsageError saying what is wrong."""
    from tinyllm.model.checkpoint import CheckpointError, default_model_dir, load_checkpoint
    from tinyllm.model.device import resolve_device

    try:
        device = resolve_device(args.device)
    except ValueError as e:
        raise UsageError(str(e)) from None
    path = Path(args.model) if args.model else default_model_dir()
    if args.model is None and not (path / "config.json").is_file():
        raise UsageError(f"the bundled model is missing from {path}; reinstall tinyllm or pass --model DIR")
    try:
        return load_checkpoint(path, device=device)
    except CheckpointError as e:
        raise UsageError(f"--model: {e}") from None


def refuse_writing_over(flag: str, out: str | None, source: str) -> None:
    """An output that is the very file the command reads would replace it (a recording lost):
    refused before the work starts."""
    if out and os.path.exists(out) and os.path.exists(source) and os.path.samefile(out, source):
        raise UsageError(
            f"{flag} {out} is the file this command reads ({source}): writing it would replace it; give another file"
        )


def check_new_file(flag: str, path: str) -> None:
    """A recording to write (``--record``): refused now, in one line, if it cannot be written or
    if writing it would overwrite one (an empty file is fair game: nothing to lose)."""
    p = Path(path)
    if not path.strip():
        raise UsageError(f"{flag} needs a file name, e.g. {flag} run.jsonl")
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give a file name, e.g. {p / 'run.jsonl'}")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"{flag} {path}: not writable")
    if p.exists() and p.stat().st_size > 0:
        raise UsageError(
            f"{flag} {path}: the file exists ({p.stat().st_size:,} bytes) and would be overwritten; "
            f"choose another name or remove it"
        )
    existed = p.exists()
    try:  # what access() cannot tell (/proc, a full disk, ...)
        open(p, "a").close()
        if not existed:
            p.unlink()
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write it ({e.strerror or e})") from None
