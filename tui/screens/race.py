"""The race screen: one panel per lane, side by side on a wide screen, stacked on a narrow one,
and the finish line's table (tui/widgets/finish_line.py) once every lane is done. It draws a race runner's newest RaceFrame,
paced like the main app (FramePacer), and sends it the same commands."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Container
from textual.screen import Screen
from textual.widgets import Static
from textual.worker import get_current_worker

from tinyllm.config import DEFAULT_BLOCK_SIZE, EngineConfig
from tinyllm.race.rules import DEFAULT_BATCH_TIMEOUT_S, DEFAULT_MAX_LEN, DEFAULT_WORKLOAD
from tinyllm.race.verdicts import Judging
from tinyllm.race.whatif import load_judging
from tinyllm.request import ContextTooLong
from tui.runners.child import ChildRunner
from tui.runners.interface import SetPaused
from tui.runners.race import RaceFrame, RaceSpec, Restart, race_workload
from tui.screens.live import FramePacer, LiveView
from tui.screens.modals import PALETTE_KEY, HelpScreen
from tui.widgets.deferred import deferred, guarded
from tui.widgets.finish_line import FinishLine
from tui.widgets.footer import FittedFooter
from tui.widgets.lane_panel import LanePanel
from tui.widgets.race_track import RaceTrack, lane_name
from tui.widgets.status import fit_fields
from tui.widgets.text_line import TextLine

WIDE = 150  # columns from which the lanes stand side by side
HOW_TO_READ = "\n".join(
    (  # paragraphs: the screen wraps them to its width
        "The same requests on the same model, one lane per scheduler (three by default). Static batching runs "
        "batches of B requests, each until its "
        "longest row is done; continuous batching refills a slot as soon as its request ends; the token-budget "
        "scheduler also splits prompts into chunks, packs every step with up to its token budget, and serves repeated "
        "prompt prefixes from cached KV blocks.",
        "Fair: every lane runs in ONE engine process, one step at a time, the lane furthest behind on its own "
        "clock going next; a lane's clock counts only its own steps (and skips idle time before an arrival), so "
        "tokens/s, TTFT and latency are that scheduler's, not whoever got the CPU. Greedy, no stop at end-of-text: "
        "every lane makes exactly the same tokens, as `tinyllm bench` does (as many tokens, their text parting late "
        "in a long run, where a lane keeps bfloat16 K/V). The status line counts every lane's steps together "
        "(a static batch's prefill is one; a slot engine's step prefills its newcomers and decodes its rows); a "
        "lane's 'steps' are its decode steps, as tinyllm bench counts them.",
        "Cells: slot or batch row, #request, a bar of its tokens so far out of its max_new_tokens, and that count; "
        "'wasted' = static batching: finished, still computed until its batch's longest row is done; '▸' and a cyan "
        "bar = prompt still being prefilled in chunks; '✓ done' = finished in the latest step. KV: the context "
        "tokens the lane's KV cache holds for running requests, out of the memory it has reserved (a static batch "
        "reserves its padded length for every row; the continuous lanes their whole cache). After each lane's "
        "name: how many sequences it can run at once and the KV memory it holds ('64 seqs · 32 MiB'). With "
        "--kv-memory MiB every lane gets the same memory: static batching and the slot cache the rows of --max-len "
        "it buys, the paged lanes the blocks it buys, which short requests share, so they run more at once (up to "
        "--max-num-seqs, default 64).",
        'What-if (--lanes with policies or settings, e.g. --lanes fcfs priority "fair budget=64"; --race can take a '
        "recording): each lane is one engine with its own settings, on the same requests at the same arrival times. "
        "At the finish line: per tenant (or priority) TTFT and end-to-end, then per request, most changed first, "
        "each lane's TTFT, end-to-end and the reason it waited most steps for (NP: preempted N times); [ and ] pick "
        "a request, whose life in every lane is drawn below the table, one row per lane.",
        "The place: without arrivals, by finishing time (every lane had all the work from the start); with "
        "arrivals, every lane's tok/s is about the rate requests came at, so by goodput (with --slo "
        "ttft=500ms,tpot=50ms: requests/s that met their targets; 'met': of the requests judged, those that did) "
        "then latency p95. The finish line's title states the rule. A request a recording saw aborted or failed "
        "is marked and left out of the ranking.",
        "Arrivals (arrival_s in the workload) come on each lane's own clock. Static batching starts a batch when B "
        "requests wait, or when the oldest has waited the batch timeout (--batch-timeout, seconds of its clock), or "
        "at once when no more are coming.",
    )
)


class RaceScreen(LiveView, Screen):
    """The race (see the module docstring). ``standalone``: the app's only screen (tinyllm-tui
    --race); otherwise opened from the main app, where Escape goes back to it."""

    owns_keys = True  # the main app's keys are off while this screen is up
    BINDINGS = [
        Binding("f1,question_mark", "help", "Help"),
        Binding("f5,space", "toggle_pause", "Pause/resume"),
        Binding("f6,n,full_stop", "step_once", "Step (paused)"),
        Binding("f7,plus,equals_sign", "slower", "Slower"),
        Binding("f8,minus", "faster", "Faster"),
        Binding("r", "restart", "Run again"),
        Binding("right_square_bracket", "request(1)", "Next request", show=False),
        Binding("left_square_bracket", "request(-1)", "Previous request", show=False),
        Binding("escape", "back", "Back to the app"),
        # the finish tables run below the screen's edge: the keys scroll it, as a mouse wheel does
        Binding("down", "scroll_down", "Scroll down", show=False),
        Binding("up", "scroll_up", "Scroll up", show=False),
        Binding("pagedown", "page_down", "Page down", show=False),
        Binding("pageup", "page_up", "Page up", show=False),
        Binding("end", "scroll_end", "To the end", show=False),
        Binding("home", "scroll_home", "To the top", show=False),
        Binding("q,ctrl+c", "app.quit", "Quit"),  # Ctrl+C as in the main app (Textual's said "Press q to quit")
    ]
    DEFAULT_CSS = """
    RaceScreen { layout: vertical; }
    #race-status { height: 1; background: $panel; }
    #lanes { height: auto; layout: vertical; }
    RaceScreen.-wide #lanes { layout: horizontal; }
    RaceScreen.-wide LanePanel { width: 1fr; }
    LanePanel { border: round $primary 50%; border-title-color: $text; border-title-style: bold; padding: 0 1; }
    RaceScreen.-short LanePanel { border: none; border-top: round $primary 50%; padding: 0; }
    #finish { height: auto; padding: 0 1; }
    #track { display: none; padding: 0 1; }
    RaceScreen.-wide #track { margin-bottom: 1; }
    RaceScreen.-track #track { display: block; }
    RaceScreen.-short #finish { padding: 0; }
    #race-legend { height: auto; color: $text-muted; padding: 0 1; }
    """

    def __init__(self, runner, *, workload: str, model_name: str, standalone: bool, judging: Judging | None = None):
        super().__init__()
        self.runner = runner
        self.judging = judging or Judging()  # --slo, a workload line's own, a recording's aborted requests
        self.workload = workload
        self.model_name = model_name
        self.standalone = standalone
        self.startup_error: str | None = None
        self._pacer = FramePacer()
        self._publish_s = 0.0
        self._shown = -1
        self._drawn: RaceFrame | None = None  # the frame last drawn (the track is placed again after layout)
        self._seen_log = 0
        self._legend_shown = ""
        self.frames_drawn = 0

    def compose(self) -> ComposeResult:
        yield TextLine(id="race-status")
        with Container(id="lanes"):
            for lane in self.runner.frame.lanes:
                yield LanePanel(id=f"lane-{lane.key}")
        yield RaceTrack(id="track")
        yield FinishLine(self.judging, id="finish")
        yield Static(id="race-legend", markup=False)
        yield FittedFooter()

    def on_mount(self) -> None:
        self.query_one("#finish").display = False
        self.run_worker(self._loop, thread=True, name="race", exit_on_error=False)
        self._layout(self.size.width, self.size.height)
        self._tick()

    def on_resize(self, event) -> None:
        self._layout(event.size.width, event.size.height)

    def _layout(self, width: int, height: int) -> None:
        self.set_class(width >= WIDE, "-wide")
        short = height < 34 or width < 100
        self.set_class(short, "-short")
        self.refresh_from_runner(force=True)

    def _track_fits(self, f: RaceFrame) -> bool:
        """Whether the chart of tokens over time has room: side by side lanes, or a short screen's
        one-line lanes, leave it room from 28 lines; else it shows where the lines the lanes,
        the status, the finish table (once shown) and the legend leave free hold it (a tall
        screen with lanes one above the other: 120 x 40 had 13 free lines and no chart)."""
        width, height = self.size
        if width >= WIDE or (self.has_class("-short") and height >= 28):
            return True
        lanes = self.query_one("#lanes")
        if not lanes.outer_size.height:  # not laid out yet: as it was
            return self.has_class("-track")
        used = 1 + sum(self.query_one(q).outer_size.height for q in ("#race-status", "#race-legend"))  # + footer
        finish = self.query_one("#finish", FinishLine)  # (its own count: at the finish it is not laid out yet)
        used += lanes.outer_size.height + (finish.get_content_height(None, None, width) if f.done else 0)
        return height - used >= RaceTrack.height_for(len(f.lanes))

    @deferred  # (also queued with call_after_refresh: the screen may have gone)
    def _place_track(self, f: RaceFrame | None) -> None:
        if f is None:
            return
        self.set_class(self._track_fits(f), "-track")
        if self.has_class("-track"):
            self.query_one("#track", RaceTrack).show(f.lanes)

    def _place_drawn(self) -> None:
        """Place the chart for the frame drawn last (not the one of when this was queued)."""
        self._place_track(self._drawn)

    def _loop(self) -> None:
        worker = get_current_worker()
        self.runner.run(cancelled=lambda: worker.is_cancelled)

    def on_unmount(self) -> None:
        self.runner.stop()

    # -- drawing ---------------------------------------------------------------------------------
    @deferred  # a timer's tick, a resize, a test: nothing once the screen is leaving
    def refresh_from_runner(self, force: bool = False) -> None:
        if self.runner.start_error is not None and self.startup_error is None:
            self._failed(self.runner.start_error)
            return
        f: RaceFrame = self.runner.frame
        if not (force or self._pacer.due()) or (f.seq == self._shown and not force):
            return
        self._shown, self._drawn = f.seq, f
        self.frames_drawn += 1
        short = self.has_class("-short")
        self.query_one("#race-status", TextLine).set(self._status(f))
        panels = [self.query_one(f"#lane-{lane.key}", LanePanel) for lane in f.lanes]
        for panel, lane in zip(panels, f.lanes):
            panel.show(lane, compact=short)
        wide = self.has_class("-wide") and all(p.content_region.width for p in panels)  # (0 before layout)
        tallest = max((len(p.lines(p.content_region.width)) for p in panels), default=0) if wide else 0
        for panel in panels:
            panel.pad_to(tallest)
        finish = self.query_one("#finish", FinishLine)
        if f.done and not finish.display and finish.comparing_lanes(f.lanes):
            self.call_after_refresh(guarded(finish, finish.scroll_visible), animate=False)  # the comparison is the news
        finish.display = f.done
        if f.done:
            finish.show(f.lanes, f.cold_steps, f.turns, f.clock)
        self._place_track(f)  # (after the finish table: it takes lines)
        self.call_after_refresh(self._place_drawn)  # again once the lanes have their heights
        self.call_after_refresh(self._restatus)  # once laid out: is there more below?
        legend = self._legend(not self.has_class("-wide"))
        if legend != self._legend_shown:
            self._legend_shown = legend
            self.query_one("#race-legend", Static).update(legend)
        for e in f.log:
            if e.seq > self._seen_log and e.kind == "error":
                self.notify(e.text, title="race", severity="error", timeout=8)
        if f.log:
            self._seen_log = max(self._seen_log, f.log[-1].seq)

    def _legend(self, brief: bool) -> str:
        if brief:
            return "bar: tokens / max · wasted: done, still computed · KV: used / held · ? help"
        return HOW_TO_READ

    def _status(self, f: RaceFrame) -> Text:
        """The status line, fitted to the screen as the app's is: whole fields give way, those of
        least use first (the state and the pass count stay at any width)."""
        if f.status == "loading":
            t = Text(no_wrap=True, overflow="ellipsis")
            t.append(" ⧗ LOADING ", style="bold reverse cyan")
            t.append(
                f" race · {self.workload} · the engine process is importing torch, reading the weights and warming up…",
                style="bold",
            )
            return t
        if f.done:
            state = (" ✓ FINISHED ", "bold reverse blue")
        elif f.paused:
            state = (" ⏸ PAUSED ", "bold reverse yellow")
        else:
            state = (" ▶ RACE ", "bold reverse green")
        n = self.runner.threads
        total = f.lanes[0].total if f.lanes else 0
        last = next((lane_name(v) for v in f.lanes if v.key == f.last_lane), f.last_lane)
        passes = f" {f.turns:,} step{'s' if f.turns != 1 else ''}, all lanes"  # each lane's steps: its panel
        fields = [(*state, 0), (passes, "bold", 0)]
        if last and not f.done:
            fields.append((f" · last: {last}", "bold", 2))
        for text, rank in (
            (self.workload, 1),
            (f"{total} requests", 3),
            ("greedy", 6),
            (self.model_name, 4),
            (self.runner.device, 5),
            (f"{n} thread{'s' if n != 1 else ''}" if n else "? threads", 5),
            (f"delay {f.step_delay_ms} ms/step", 3),
        ):
            fields.append((f" · {text}", "dim", rank))
        if self.scroll_y < self.max_scroll_y:  # the finish tables go on below the edge: say so
            fields.insert(2, (" · ↓ more below: PgDn / End", "bold yellow", 2))
        return fit_fields(fields, max(20, self.size.width))

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        self.call_after_refresh(self._restatus)  # "more below" comes and goes with the scroll

    @deferred
    def _restatus(self) -> None:
        if self._drawn is not None:
            self.query_one("#race-status", TextLine).set(self._status(self._drawn))

    def _failed(self, e: Exception) -> None:
        """The race process could not start: leave with its one-line reason (exit code 2 when
        standalone; a notification when opened from the main app)."""
        self.startup_error = str(e)
        self.runner.stop()
        if self.standalone:
            self.app.startup_error = self.startup_error
            self.app.exit(return_code=2)
        else:
            self.app.notify(self.startup_error, title="the race could not start", severity="error", timeout=10)
            self.dismiss()

    # -- keys ------------------------------------------------------------------------------------
    def check_action(self, action: str, parameters) -> bool | None:
        if action == "back":
            return not self.standalone
        return True

    def action_help(self) -> None:
        keys = [b for b in self.BINDINGS if self.check_action(b.action, ())]  # only the keys that work here
        how = ("How to read the race", HOW_TO_READ)
        self.app.push_screen(HelpScreen(keys, "tinyllm-tui race — keys", how, (PALETTE_KEY,)))

    def action_request(self, delta: int) -> None:
        """What-if finish line: show the next / previous request's lanes."""
        finish = self.query_one("#finish", FinishLine)
        if finish.move(delta):
            self.call_after_refresh(guarded(finish, finish.scroll_visible), animate=False)
        else:
            self.notify("\\[ and ] pick a request in a what-if's comparison, once every lane has finished", timeout=3)

    def action_restart(self) -> None:
        self.runner.send(Restart())

    def action_back(self) -> None:
        self.dismiss()


class RaceApp(App):
    """The race screen as the whole app (tinyllm-tui --race)."""

    TITLE = "tinyllm-tui race"
    BINDINGS = [Binding("ctrl+c", "quit", "Quit", show=False, priority=True)]  # in every screen (its help too)

    def __init__(self, runner, *, workload: str, model_name: str, judging: Judging | None = None):
        super().__init__()
        self.runner = runner
        self.workload = workload
        self.model_name = model_name
        self.judging = judging
        self.startup_error: str | None = None  # the race process could not start; main() prints it

    def on_mount(self) -> None:
        self.push_screen(
            RaceScreen(
                self.runner, workload=self.workload, model_name=self.model_name, standalone=True, judging=self.judging
            )
        )

    def refresh_from_runner(self, force: bool = False) -> None:
        """Draw the newest frame now (tests; the screen otherwise draws at its own pace)."""
        if isinstance(self.screen, RaceScreen):
            self.screen.refresh_from_runner(force=force)

    async def action_quit(self) -> None:
        self.runner.stop()
        self.exit()

    def on_unmount(self) -> None:
        self.runner.stop()


# -- the main app's `r` key -----------------------------------------------------------------------
def open_race(app) -> None:
    """Open the race over the main app, on its model, with the workload the app loaded last
    (--prompts or F3; none: the race's default, and its status line says which), the app's slot
    count, --max-len (up to the race's 512; a shorter one the workload does not fit: 512) and paged
    pool (--kv-blocks, --block-size) or, started with --kv-memory, its KV budget (every lane at that
    memory); a max_len other than the app's is said in the status line. The app's own engine is
    paused meanwhile (it would take CPU from the lanes) and resumed afterwards if it was running."""
    from tinyllm.workload import WorkloadError, resolve_workload

    runner = app.runner
    snap = runner.frame.snapshot
    engine = runner.engine  # EngineRunner: the model is in this process
    spec = runner.spec  # ChildRunner: it is in the engine process
    if app.tokenizer is None or (engine is None and spec is None):
        app.notify(
            "The race runs the model here: not in a replay, nor attached to a server.", severity="warning", timeout=5
        )
        return
    if engine is not None:
        max_seq_len = engine.model.cfg.max_seq_len
        model_dir = "(in this process)"
    else:
        from tinyllm.model.config import load_config_and_tokenizer

        model_dir = spec.model_dir
        max_seq_len = load_config_and_tokenizer(Path(model_dir))[0].max_seq_len
    default_len = min(max_seq_len, DEFAULT_MAX_LEN)
    own_len = 0 < snap.max_len < default_len  # the app's --max-len, where it set a shorter one
    loaded = getattr(app, "workload", None)
    if loaded is not None:
        name = f"{loaded.name.removesuffix('.jsonl')} (loaded in the app)"
    else:
        name = f"{DEFAULT_WORKLOAD} (the race's default: no prompts loaded)"
    work, why = None, ""
    for max_len in ([snap.max_len] if own_len else []) + [default_len]:  # the app's length, if its requests fit
        try:
            work = race_workload(loaded or resolve_workload(DEFAULT_WORKLOAD), app.tokenizer.encode, max_len)
            break
        except WorkloadError as e:
            why = str(e)
    if work is None:
        app.notify(why, title="the race could not start", severity="error", timeout=10)
        return
    if max_len != snap.max_len:  # said: the lanes' rows hold max_len tokens each
        name += (
            f"; at max_len {max_len}: its requests do not fit the app's {snap.max_len}"
            if own_len
            else f"; at the race's max_len {max_len} (the app's is {snap.max_len})"
        )
    budget = snap.max_batched_tokens
    config = engine.config if engine is not None else spec.config  # the app's engine settings
    kv_mib = config.kv_memory_mib
    fits = max_len <= snap.max_len  # (a pool that holds one request of the app's holds one)
    blocks = snap.kv.n_blocks if snap.kv.kind == "paged" and fits and not kv_mib else None  # --kv-blocks
    run = EngineConfig.best(  # the app's
        max_num_seqs=config.max_num_seqs if kv_mib else snap.n_slots,
        max_len=max_len,
        block_size=snap.kv.block_size or DEFAULT_BLOCK_SIZE,
        kv_blocks=blocks,
        max_batched_tokens=budget if budget and budget >= snap.n_slots else None,
        kv_memory_mib=kv_mib,
        kv_cache_dtype=config.kv_cache_dtype,
        device=None if spec is None else spec.device,
        threads=runner.threads or None,
    )
    race = RaceSpec(model_dir, work, name, run, DEFAULT_BATCH_TIMEOUT_S)
    was_paused = runner.frame.paused
    runner.send(SetPaused(True))
    try:
        if engine is not None:
            from tui.runners.race import RaceRunner

            race_runner = RaceRunner(lambda: race.make_race(engine.model), device=runner.device, threads=runner.threads)
        else:
            race_runner = ChildRunner(race).start(wait=False)
    except (ValueError, ContextTooLong) as e:
        app.notify(" ".join(str(e).split()), title="the race could not start", severity="error", timeout=10)
        runner.send(SetPaused(was_paused))
        return

    def back(_=None) -> None:
        if not was_paused:
            runner.send(SetPaused(False))

    judging = Judging(app.slo)  # the app's --slo; a workload line's own "slo" where it has one
    try:
        judging = load_judging(str(loaded or resolve_workload(DEFAULT_WORKLOAD)), app.slo)
    except WorkloadError:  # (it was read once already: only a file changed since)
        pass
    screen = RaceScreen(race_runner, workload=name, model_name=app.model_name, standalone=False, judging=judging)
    app.push_screen(screen, back)
