"""Command-line argument helpers shared by `tinyllm` and `tinyllm-tui`: one-line errors and
checked argument types. No torch, no textual: every command line imports this first.

Every user error is one line on stderr and exit code 2 (``EXIT_USAGE``), never a traceback."""

from __future__ import annotations

import argparse
import os
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


def comma_list(s: str) -> tuple[str, ...]:
    """``a,b,c`` as names (--allowed-hosts, --allowed-origins): none empty, none with spaces inside."""
    items = tuple(x.strip() for x in s.split(","))
    bad = next((x for x in items if not x or " " in x), None)
    if bad is not None:
        raise argparse.ArgumentTypeError(f"expected names separated by commas, got {s!r}")
    return items


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


def add_sampling_args(p: argparse.ArgumentParser, max_new_tokens: int, what: str) -> None:
    """--temperature, --top-k, --top-p and --max-new-tokens, defined once: how ``tinyllm generate``
    samples its text, and the app's defaults for new requests (``what`` says which, as the title
    of their group in --help)."""
    g = p.add_argument_group("sampling", what)
    g.add_argument("--temperature", type=non_negative_float, default=0.8, metavar="T", help="0 = greedy (default 0.8)")
    g.add_argument(
        "--top-k", type=positive_int, default=None, metavar="K", help="draw among the K likeliest tokens (default all)"
    )
    g.add_argument(
        "--top-p",
        type=unit_interval,
        default=None,
        metavar="P",
        help="draw among the likeliest tokens that make up probability P (default all)",
    )
    g.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=max_new_tokens,
        metavar="N",
        help=f"tokens to generate at most (default {max_new_tokens})",
    )


def add_clock_args(p: argparse.ArgumentParser, scope: str = "") -> None:
    """--clock and --cost-profile: how a race's or a what-if's steps are timed (``scope``: the
    option's prefix in the help, e.g. "--race: ")."""
    p.add_argument(
        "--clock",
        choices=["cost", "wall"],
        default=None,
        help=f"{scope}how a step's time is counted: cost (default: from its work, by a cost profile "
        "(--cost-profile), the same for every lane: the same figures on every run) or wall (each lane's "
        "measured compute)",
    )
    add_cost_profile_arg(p, scope)


def add_cost_profile_arg(p: argparse.ArgumentParser, scope: str = "") -> None:
    """--cost-profile FILE | reference | measure (tinyllm/race/calibrate.py), for every command
    on the cost clock."""
    p.add_argument(
        "--cost-profile",
        metavar="FILE|reference|measure",
        default=None,
        help=f"{scope}what the cost clock's coefficients rest on: a profile's FILE (e.g. measured on the "
        "machine that will serve), 'reference' (the bundled model's, shipped), or 'measure' (calibrate now, "
        "kept for later runs if it fits well); default: $TINYLLM_COST_PROFILE, else this machine's kept "
        "profile, else the reference",
    )


# -- what several commands share: loading the model, not writing over an input --------------------


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
