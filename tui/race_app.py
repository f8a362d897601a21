"""``tinyllm-tui --race [WORKLOAD]``: the race as an app of its own; its command-line options;
and the main app's ``r`` key, which opens the same race screen over the app.

Everything the user can get wrong is checked here before any process starts (one line, exit 2,
like every other tinyllm-tui option): the workload, the lanes, options that do not apply to a race.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from textual.app import App

from tinyllm.args import check_device
from tinyllm.race.rules import DEFAULT_BATCH_TIMEOUT_S, check_static_batches
from tinyllm.race.views import LANES
from tinyllm.request import DEFAULT_MAX_BATCHED_TOKENS, ContextTooLong
from tui.messages import SetPaused
from tui.race_process import ProcessRaceRunner, RaceItem, RaceSpec
from tui.race_screen import RaceScreen

DEFAULT_WORKLOAD = "mixed_lengths"     # short and long requests together: where static batching loses most
DEFAULT_NEW = 64                       # a workload line without max_new_tokens: as in tinyllm bench
DEFAULT_MAX_LEN = 512                  # the continuous lanes' context, as in tinyllm bench


class RaceApp(App):
    """The race screen as the whole app (tinyllm-tui --race)."""
    TITLE = "tinyllm-tui race"

    def __init__(self, runner, *, workload: str, model_name: str):
        super().__init__()
        self.runner = runner
        self.workload = workload
        self.model_name = model_name
        self.startup_error: str | None = None      # the race process could not start; main() prints it

    def on_mount(self) -> None:
        self.push_screen(RaceScreen(self.runner, workload=self.workload, model_name=self.model_name, standalone=True))

    def refresh_from_runner(self, force: bool = False) -> None:
        """Draw the newest frame now (tests; the screen otherwise draws at its own pace)."""
        if isinstance(self.screen, RaceScreen):
            self.screen.refresh_from_runner(force=force)

    async def action_quit(self) -> None:
        self.runner.stop()
        self.exit()

    def on_unmount(self) -> None:
        self.runner.stop()


def add_race_args(p: argparse.ArgumentParser) -> None:
    from tinyllm.args import non_negative_float
    p.add_argument("--race", nargs="?", const=DEFAULT_WORKLOAD, default=None, metavar="WORKLOAD",
                   help="race static batching, continuous batching and the token-budget scheduler on the same "
                        f"requests (a bundled workload's name or a JSONL file; default {DEFAULT_WORKLOAD})")
    p.add_argument("--batch-timeout", type=non_negative_float, default=None, metavar="S",
                   help="--race with arrivals: static batching starts a partial batch once its oldest request has "
                        f"waited S seconds of its clock (default {DEFAULT_BATCH_TIMEOUT_S:g})")
    p.add_argument("--lanes", default=None, metavar="LIST",
                   help=f"--race: which lanes, comma-separated, at least two of {','.join(LANES)} (default all)")


def race_app(parser, a) -> App | None:
    """The race app for ``--race`` (None without it, after refusing race-only options)."""
    if a.race is None:
        for flag, value in (("--batch-timeout", a.batch_timeout), ("--lanes", a.lanes)):
            if value is not None:
                parser.error(f"{flag} applies to --race only")
        return None
    spec = race_spec(parser, a)
    if a.engine_thread:
        from tui.race_runner import RaceRunner
        try:
            model, device = spec.build()
        except Exception as e:                            # noqa: BLE001 - one line, exit 2
            parser.error(" ".join(str(e).split()))
        runner = RaceRunner(lambda: spec.make_race(model), a.paused, a.step_delay, device, a.threads)
    else:
        runner = ProcessRaceRunner(spec, paused=a.paused, step_delay_ms=a.step_delay).start()
    name = Path(a.model).name if a.model else "bundled Shakespeare"
    return RaceApp(runner, workload=spec.name, model_name=name)


def race_spec(parser, a) -> RaceSpec:
    """Check every race option (no torch, no process) and return the spec the race is built from."""
    from tinyllm.model.config import CheckpointError, default_model_dir, load_config_and_tokenizer
    from tinyllm.workload import WorkloadError, resolve_workload
    for flag, value, why in (("--replay", a.replay, "a race runs a model"),
                             ("--attach", getattr(a, "attach", None), "a race runs a model here"),
                             ("--record", a.record, "a race is not recorded"),
                             ("--prompts", a.prompts, "give the workload to --race"),
                             ("--kv", a.kv, "each lane has its own KV layout"),
                             ("--[no-]chunked-prefill", a.chunked_prefill, "the third lane is the chunked one"),
                             ("--[no-]prefix-cache", a.prefix_cache, "the chunked lane caches prefixes")):
        if value is not None:
            parser.error(f"{flag} does not apply to --race ({why})")
    check_device(parser, a.device)
    path = Path(a.model) if a.model else default_model_dir()
    try:
        cfg, tok = load_config_and_tokenizer(path)
    except CheckpointError as e:
        parser.error(f"--model: {e}")
    max_len = a.max_len or min(cfg.max_seq_len, DEFAULT_MAX_LEN)
    if max_len > cfg.max_seq_len:
        parser.error(f"--max-len {max_len} is more than the model's context ({cfg.max_seq_len})")
    lanes = LANES if a.lanes is None else tuple(k.strip() for k in a.lanes.split(","))
    bad = [k for k in lanes if k not in LANES]
    if bad or len(set(lanes)) < 2:
        parser.error(f"--lanes {a.lanes}: choose at least two of {', '.join(LANES)}"
                     + (f" (unknown: {', '.join(bad)})" if bad else ""))
    budget = a.max_batched_tokens or DEFAULT_MAX_BATCHED_TOKENS
    if "chunked" in lanes and budget < a.slots:
        parser.error(f"--max-batched-tokens {budget} is less than --slots {a.slots}: every running request "
                     f"decodes one token per step, so the budget must cover them all")
    try:
        wl_path = resolve_workload(a.race)
        work = race_workload(wl_path, tok.encode, max_len)
        if "static" in lanes:
            check_static_batches([(len(ids), new) for _, ids, new in sorted(work, key=lambda w: w[0])], a.slots,
                                 cfg.max_seq_len)
    except (WorkloadError, ContextTooLong) as e:
        parser.error(f"--race: {e}")
    timeout = DEFAULT_BATCH_TIMEOUT_S if a.batch_timeout is None else a.batch_timeout
    return RaceSpec(str(path), work, wl_path.name.removesuffix(".jsonl"), a.slots, max_len, a.block_size,
                    a.kv_blocks, a.max_batched_tokens, timeout, tuple(k for k in LANES if k in lanes), a.device,
                    a.threads, a.seed)


def race_workload(path: Path, encode, max_len: int) -> tuple[RaceItem, ...]:
    """A workload file as (arrival_s, token ids, max_new_tokens): sampling settings and
    end-of-text are left out (the race is greedy and makes every token, as tinyllm bench)."""
    from tinyllm.workload import load_workload, tokenize_checked
    items = load_workload(path)
    ids = tokenize_checked(items, path, encode, max_len, DEFAULT_NEW)
    return tuple((it.arrival_s, tuple(i), it.max_new_tokens or DEFAULT_NEW) for it, i in zip(items, ids))


# -- the main app's `r` key -----------------------------------------------------------------------
def open_race(app) -> None:
    """Open the race over the main app, on its model, with the default workload and the app's
    slot count. The app's own engine is paused meanwhile (it would take CPU from the lanes) and
    resumed afterwards if it was running."""
    from tinyllm.workload import WorkloadError, resolve_workload
    runner = app.runner
    snap = runner.frame.snapshot
    engine = getattr(runner, "engine", None)              # EngineRunner: the model is in this process
    spec = getattr(runner, "spec", None)                  # ProcessRunner: it is in the engine process
    if app.tokenizer is None or (engine is None and spec is None):
        app.notify("The race runs the model here: not in a replay, nor attached to a server.",
                   severity="warning", timeout=5)
        return
    if engine is not None:
        max_seq_len = engine.model.cfg.max_seq_len
        model_dir = "(in this process)"
    else:
        from tinyllm.model.config import load_config_and_tokenizer
        model_dir = spec.model_dir
        max_seq_len = load_config_and_tokenizer(Path(model_dir))[0].max_seq_len
    max_len = min(max_seq_len, DEFAULT_MAX_LEN)
    try:
        path = resolve_workload(DEFAULT_WORKLOAD)
        work = race_workload(path, app.tokenizer.encode, max_len)
    except WorkloadError as e:
        app.notify(str(e), title="the race could not start", severity="error", timeout=10)
        return
    budget = snap.max_batched_tokens
    race = RaceSpec(model_dir, work, DEFAULT_WORKLOAD, snap.n_slots, max_len, snap.kv.block_size or 16, None,
                    budget if budget and budget >= snap.n_slots else None, DEFAULT_BATCH_TIMEOUT_S,
                    device=None if spec is None else spec.device, threads=runner.threads or None)
    was_paused = runner.frame.paused
    runner.send(SetPaused(True))
    try:
        if engine is not None:
            from tui.race_runner import RaceRunner
            race_runner = RaceRunner(lambda: race.make_race(engine.model), device=runner.device, threads=runner.threads)
        else:
            race_runner = ProcessRaceRunner(race).start()
    except (ValueError, ContextTooLong) as e:
        app.notify(" ".join(str(e).split()), title="the race could not start", severity="error", timeout=10)
        runner.send(SetPaused(was_paused))
        return

    def back(_=None) -> None:
        if not was_paused:
            runner.send(SetPaused(False))
    app.push_screen(RaceScreen(race_runner, workload=DEFAULT_WORKLOAD, model_name=app.model_name, standalone=False),
                    back)
