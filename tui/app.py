"""tinyllm-tui: watch continuous batching happen, and debug a scheduler by eye.

The App never touches the engine: it sends commands to a runner that owns it (``ChildRunner``,
the engine in a child process, by default; ``EngineRunner``, a thread, in tests and with
``--engine-thread``) and redraws from the runner's newest ``Frame`` at up to 20 Hz, paced by
``FramePacer`` so drawing never takes much CPU from the engine.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.widgets import Sparkline, Static
from textual.worker import get_current_worker

from tinyllm.model.tokenizer import Tokenizer
from tinyllm.request import RequestSettings, Sampling
from tui.runners.interface import Frame, LogEntry, Runner
from tui.screens.commands import AppCommands
from tui.screens.key_policy import KeyPolicy
from tui.screens.layout import PANES_HELP, PANES_KEYS, PanesLayout
from tui.screens.live import FramePacer, LiveView
from tui.screens.log_feed import LogFeed
from tui.screens.replay_keys import ReplayKeys
from tui.screens.request_keys import RequestKeys
from tui.screens.view_keys import ViewKeys
from tui.widgets.block_map import BlockMap
from tui.widgets.deferred import deferred, guarded
from tui.widgets.event_log import EventLog
from tui.widgets.footer import FittedFooter
from tui.widgets.kv_panel import KVPanel
from tui.widgets.panes import PanesView
from tui.widgets.prefix_cache_map import PrefixCacheMap
from tui.widgets.prompt_editor import PromptEditor
from tui.widgets.request_list import RequestList
from tui.widgets.request_pane import RequestPane
from tui.widgets.selection import RequestSelected
from tui.widgets.server_panel import ServerPanel
from tui.widgets.slot_grid import SlotGrid, slots_title
from tui.widgets.status import fit_fields, scrubber, status_fields
from tui.widgets.text_line import TextLine
from tui.widgets.timeline import TimelinePanel

REFRESH_HZ = 20  # at most; FramePacer lowers it (to 5 Hz) when drawing costs the engine too much
FLAT_OUT_S = 0.125  # running flat out (step delay < 50 ms), a frame at most this often: the whole
# frame each time held key presses back (p95 45-75 ms at 11-14 frames/s)


class TinyLLMApp(PanesLayout, ViewKeys, LogFeed, KeyPolicy, LiveView, RequestKeys, ReplayKeys, App):
    CSS_PATH = "app.tcss"
    TITLE = "tinyllm-tui"
    COMMANDS = App.COMMANDS | {AppCommands}  # Ctrl+P: the app's actions, each with its keys
    HELP_EXTRA, HELP_TEXT = PANES_KEYS, PANES_HELP  # the help's rows and words beside the bindings'
    # One source of truth for keys: the footer and the help screen both read this list.
    BINDINGS = [
        # Into and out of the prompt editor: priority, so that the keys after them (a burst: a
        # fast typist, a paste without brackets) go where the focus now is; each is off where it
        # does not apply (i is text in the editor, Esc closes a dialog).
        Binding("i,slash,enter", "focus_input", "Type a prompt", priority=True),
        Binding("escape", "leave_input", "Leave the prompt", priority=True),
        Binding("f1", "help", "Help", priority=True),
        Binding("question_mark", "help", "Help", show=False),
        Binding("f2", "settings", "Settings", priority=True),
        Binding("s", "settings", "Settings", show=False),
        Binding("f3", "load_prompts", "Load prompts", priority=True),
        Binding("o", "load_prompts", "Load prompts", show=False),
        Binding("f5", "toggle_pause", "Pause/resume", priority=True),
        Binding("space", "toggle_pause", "Pause/resume", show=False),
        Binding("f6", "step_once", "Step", priority=True),
        Binding("n,full_stop", "step_once", "Step once (paused)", show=False),
        Binding("f7", "slower", "Slower", priority=True),
        Binding("plus,equals_sign", "slower", "Slower: +step delay", show=False),
        Binding("f8", "faster", "Faster", priority=True),
        Binding("minus", "faster", "Faster: -step delay", show=False),
        Binding("f9,ctrl+x", "abort_selected", "Abort", priority=True),
        Binding("x,delete", "abort_selected", "Abort selected request", show=False),
        Binding("ctrl+k", "abort_all", "Abort all", priority=True),
        Binding("X", "abort_all", "Abort all requests", show=False),
        Binding("f4", "clear_prefix_cache", "Clear prefix cache", show=False, priority=True),
        Binding("c", "clear_prefix_cache", "Clear the prefix cache", show=False),
        Binding("t", "toggle_timeline", "Timeline / requests", show=False),
        Binding("p", "toggle_panes", "Panes / list view", show=False),
        Binding("e", "focus_log", "Events: scroll back (the last 10,000)", show=False),
        Binding("r", "race", "Race: static vs continuous batching", show=False),
        Binding("z", "zoom_out", "Timeline: more steps per column", show=False),
        Binding("Z", "zoom_in", "Timeline: fewer steps per column", show=False),
        Binding("b,comma", "step_back", "Replay: one step back", show=False),
        Binding("g", "goto_step", "Replay: go to a step", show=False),
        Binding("less_than_sign", "replay_start", "Replay: go to the start", show=False),
        Binding("greater_than_sign", "replay_end", "Replay: go to the end", show=False),
        Binding("right_square_bracket", "next_event", "Replay: the selected request's next event", show=False),
        Binding("left_square_bracket", "prev_event", "Replay: its previous event", show=False),
        Binding("q", "quit", "Quit", show=False),
        Binding("ctrl+c,ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(
        self,
        runner: Runner,
        tokenizer: Tokenizer | None,
        *,
        model_name: str = "model",
        settings: RequestSettings | None = None,
        prompts_file: Path | None = None,
        recording: Path | None = None,
        panes: bool = False,
    ):
        super().__init__()
        self.runner = runner  # owns the engine; we only send commands and read frames
        self.replay = runner.mode == "replay"  # a recording played back: read-only, no tokenizer
        self.remote = runner.mode in ("attach", "metrics")  # attached to a server: it paces itself
        self.metrics_only = runner.mode == "metrics"  # a vLLM server: no slots, no blocks
        self.tokenizer = tokenizer
        self.model_name = model_name
        snap = runner.frame.snapshot
        self.max_len = snap.max_len
        self.settings = settings or RequestSettings(Sampling(), min(100, self.max_len - 1))
        self.prompts_file = prompts_file
        self.workload: Path | None = None  # the prompt file loaded last (--prompts or F3): what `r` races
        self.recording = recording  # --record FILE: shown in the status line, named at exit
        self.start_panes = panes  # --panes: start in the panes view
        self.slo = None  # --slo (tinyllm.slo.SLO, set by tui/cli.py): the counters and request rows judge by it
        self.startup_error: str | None = None  # set when the engine could not start; main() prints it
        self.selected: int | None = None
        self._shown_seq = -1  # the frame every panel has drawn (a loading frame has seq 0)
        self._details_frame: Frame | None = None  # that frame (the list, pane and timeline keep showing it)
        self._placed: tuple = ()  # (selection, rows) the list's cursor was last put on
        self._following = True  # live: the selection follows the newest request until the
        # user moves it (back on the newest, or a prompt sent: again)
        self._last_log: LogEntry | None = None  # the newest event-log entry shown
        self._flags: dict[int, tuple[str, int]] = {}
        self._idle_at_step: int | None = None  # the step an engine went idle at, running (log_feed.py)
        self._pacer = FramePacer(max_hz=REFRESH_HZ)
        self._publish_s = 0.0
        self.frames_drawn = 0
        self._next_flat_out = 0.0  # running flat out: no frame drawn before this

    # -- layout ----------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield TextLine(id="status")
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield ServerPanel(id="server")
                yield PrefixCacheMap(id="prefix")
                yield SlotGrid(id="slots")
                yield BlockMap(id="blocks")
                yield KVPanel(id="kv")
                yield Sparkline([], id="tps")
                yield RequestList(id="requests")
                yield TimelinePanel(id="timeline")
            with Vertical(id="right"):
                yield RequestPane(prompts=not self.replay, id="pane")
                yield EventLog(id="log")
        yield PanesView(self.panes_mode(), id="panes")
        if self.replay:
            yield TextLine(id="scrubber")
        else:
            with Horizontal(id="entry"):
                yield Static(id="next-settings", markup=False)  # the next request's settings (toasts stand above)
                yield PromptEditor(self.submit_prompt, id="prompt")
        yield FittedFooter()

    def on_mount(self) -> None:
        snap = self.runner.frame.snapshot
        self._cache_titles(snap)
        if snap.kv.kind != "paged":
            self.query_one("#blocks", BlockMap).display = False
        self.query_one("#tps").border_title = "tokens/s (last 30 s of steps)"  # engine time: idle adds none
        self.query_one("#kv").border_title = "KV cache & counters"
        self.query_one("#requests").border_title = "Requests"
        self.query_one("#timeline").border_title = "Timeline (t: requests, z/Z: zoom)"
        self.query_one("#timeline").display = False
        self.query_one("#server").border_title = f"{self.runner.kind} metrics (GET /metrics)"
        self.query_one("#server").display = self.metrics_only
        events = self.runner.kv_events  # --kv-events: the server's prefix cache
        self.query_one("#prefix").display = self.metrics_only and events is not None
        if events is not None:
            prefix = self.query_one("#prefix", PrefixCacheMap)
            prefix.endpoint = events.endpoint
            prefix.border_title = prefix.title(self.size.width)  # (fitted to the panel once laid out)
            self.query_one("#server", ServerPanel).events_shown = True
        if self.metrics_only:
            for panel in ("#slots", "#blocks", "#kv"):
                self.query_one(panel).display = False
            self.query_one("#log").border_title = "Events (this app's requests; step = seconds since attach)"
            self.query_one("#requests").border_title = "This app's requests"
            self.query_one("#timeline", TimelinePanel).unit = "s"
        self.query_one("#pane").border_title = "Request"
        self.query_one("#log").border_title = "Events"
        if self.replay:
            self._focus(self.query_one("#requests"))  # (now: the panes view may take it at once)
            warning = self.runner.warning
            if warning:
                self.notify(warning, title="recording", severity="warning", timeout=10)
        else:
            self._show_settings()
            # Focus starts in the prompt editor, so that a newcomer who types a prompt first thing
            # gets a prompt (letters there are text, never commands); with a workload loaded at
            # start (--prompts) on the list, to watch it: letters are keys there (q, space, t).
            # Esc leaves the editor, i / Enter come back; the footer says which has the keys.
            self.screen.set_focus(
                self.query_one("#requests") if self.prompts_file is not None else self.query_one("#prompt")
            )
        if self.start_panes:
            self.set_layout(True)
        self.run_worker(self._engine_loop, thread=True, name="engine", exit_on_error=False)
        self._tick()
        if self.prompts_file is not None:
            self.call_after_refresh(guarded(self, self._load_path), self.prompts_file)
        self.refresh_from_runner(force=True)

    def on_resize(self, event) -> None:
        """Small terminals (80x24) drop the sparkline and the event log, thin the borders, and
        squeeze the block map into fewer rows (a cell then stands for several blocks). Then the
        frame is drawn again at the new size: a resize is a change like any other."""
        short = event.size.height < 34 or event.size.width < 100
        self.set_class(short, "-short")
        try:
            self.query_one("#blocks", BlockMap).max_rows = 2 if short else 6
            self.query_one("#prefix", PrefixCacheMap).max_rows = 3 if short else 8
            self.query_one("#kv").border_title = (
                "KV █used ▒alloc ░reserved · counters" if short else "KV cache & counters"
            )
        except NoMatches:  # not composed yet, or shutting down
            return
        self._shown_seq = -1
        self.call_after_refresh(self.refresh_from_runner, True)

    def _engine_loop(self) -> None:
        worker = get_current_worker()
        self.runner.run(cancelled=lambda: worker.is_cancelled)

    # -- the paced refresh ---------------------------------------------------------------------
    @deferred  # a timer's, or after a resize: nothing once the app is leaving
    def refresh_from_runner(self, force: bool = False) -> None:
        """Draw the runner's newest frame, every panel from it: the one place that decides what a
        frame draws, and when. Every panel shows the same step at every moment (the request list
        and pane once trailed the slot grid by up to 0.2 s, 10-25 steps of a fast run, and the
        screen contradicted itself). The pacer keeps the drawing's cost down (20 frames a second
        to 5), and running flat out a frame comes at most every FLAT_OUT_S. The tick keeps running
        while the engine is idle, so the last frame of a run (after which an idle engine sends
        none) is always drawn, at most FLAT_OUT_S later."""
        if self.runner.start_error is not None and self.startup_error is None:
            self._engine_failed(self.runner.start_error)
            return
        self._take_back_refused()
        frame = self.runner.frame
        if frame.seq == self._shown_seq or not (force or self._pacer.due()):
            return
        now = time.perf_counter()
        if not (force or frame.paused or frame.step_delay_ms >= 50 or now >= self._next_flat_out):
            return
        self._next_flat_out = now + FLAT_OUT_S
        self._shown_seq = frame.seq
        self.frames_drawn += 1
        self._draw_state(frame)
        self._draw_details(frame)

    def _take_back_refused(self) -> None:
        """A prompt the server refused goes back into the input, if that is empty, to be edited
        (the input was cleared on sending; a local engine's app checks before sending and keeps
        it there)."""
        for text in self.runner.take_refused():
            box = self.query_one("#prompt", PromptEditor)
            if not box.text:
                box.set_text(text)

    def _cache_titles(self, snap) -> None:
        """The slot grid's and block map's sizes, from the snapshot shown: the first frame may be
        the loading one (an engine process sizes its cache from --kv-memory only once the model
        is read), so every frame checks them."""
        titles = (
            (self.query_one("#slots"), slots_title(snap)),
            (
                self.query_one("#blocks"),
                f"KV blocks ({snap.kv.n_blocks} × {snap.kv.block_size} tokens)" if snap.kv.kind == "paged" else None,
            ),
        )
        for widget, title in titles:
            if title is not None and widget.border_title != title:
                widget.border_title = title

    def _draw_state(self, frame: Frame) -> None:
        """Status, slots, blocks, KV and counters, sparkline, scrubber, log: the engine's state."""
        self._update_flags(frame)
        self.query_one("#status", TextLine).set(self._status_text(frame))
        if self.metrics_only:
            self.query_one("#server", ServerPanel).show(frame.server)
            if frame.kv_cache is not None:
                self.query_one("#prefix", PrefixCacheMap).show(frame.kv_cache)
        else:
            self._cache_titles(frame.snapshot)
            self.query_one("#slots", SlotGrid).show(frame.snapshot, self._flags)
            if frame.snapshot.kv.kind == "paged":
                self.query_one("#blocks", BlockMap).show(frame.snapshot)
            self.query_one("#kv", KVPanel).show(frame)
        spark = self.query_one("#tps", Sparkline)
        hist = list(frame.tps_history) if any(frame.tps_history) else []
        if hist != spark.data and spark.display:
            spark.data = hist
        if self.replay:
            self.query_one("#scrubber", TextLine).set(self._scrubber_text(frame))
        self._append_log(frame)

    def _draw_details(self, frame: Frame) -> None:
        """The request list, the selected request's pane and the timeline: exactly the frame's
        requests. Live, the selection follows the newest request until the user moves it (then
        it stays on its request while the frame holds it; one the engine or server no longer
        holds, a restarted server's, gives way to the newest again), so what x aborts is what the
        screen shows, never an older request left selected. A replay keeps it (seeking forward
        brings it back) and the pane says it does not exist."""
        self._details_frame = frame
        snap = frame.snapshot
        if not self.replay and (self._following or snap.request(self.selected) is None):
            self._following = True
            self.selected = max((v.rid for v in snap.requests), default=None)
        elif self.selected is None:
            self.selected = snap.requests[0].rid if snap.requests else None
        if self.panes_on:  # (the list view is drawn afresh when it comes back)
            self._draw_panes(frame)
            return
        requests = self.query_one("#requests", RequestList)
        requests.show(frame)
        placed = (self.selected, requests.rids)
        if placed != self._placed:  # only when the selection or the rows changed:
            self._placed = placed  # every draw would undo scrolling, and a ↓ on
            requests.select_rid(self.selected)  # its way to the app
        self._show_pane(frame)
        self._show_timeline(frame)

    def _show_pane(self, frame: Frame) -> None:
        missing = f"does not exist yet at step {frame.snapshot.counters.steps}" if self.replay else "is gone"
        self.query_one("#pane", RequestPane).show(frame, self.selected, missing)

    def _engine_failed(self, e: Exception) -> None:
        """The engine process could not build the engine: leave with its one-line reason, as a
        bad argument would have (main() prints it and exits 2)."""
        from tinyllm.model.config import CheckpointError

        self.startup_error = f"--model: {e}" if isinstance(e, CheckpointError) else str(e)  # one line already
        self.runner.stop()
        self.exit(return_code=2)

    def _status_text(self, f: Frame) -> Text:
        """The status line, fitted to the screen: fields of least use give way first (the mode
        and the step counter stay at any width)."""
        return fit_fields(status_fields(f, self.runner, self.model_name, self.recording), max(20, self.size.width))

    def redraw_status(self) -> None:
        """The status line again, for the frame shown (something the runner holds changed)."""
        self.query_one("#status", TextLine).set(self._status_text(self.runner.frame))

    def _scrubber_text(self, f: Frame) -> Text:
        return scrubber(f, self.runner, self.size.width, self.selected)

    # -- user actions ---------------------------------------------------------------------------
    def select(self, rid: int) -> None:
        """Select request ``rid`` in every panel (the list's cursor, the pane, the timeline). The
        selection stays there (the newest request: it follows the newest again)."""
        self.selected = rid
        frame = self._details_frame or self.runner.frame  # the frame the other panels show
        self._following = rid == max((v.rid for v in frame.snapshot.requests), default=rid)
        if self.panes_on:
            self.query_one(PanesView).mark(rid)
            return
        requests = self.query_one("#requests", RequestList)
        requests.select_rid(rid)
        self._placed = (rid, requests.rids)
        self._show_pane(frame)
        self._show_timeline(frame)

    @deferred  # a message the list posted: the app may be leaving by now
    def on_request_selected(self, event: RequestSelected) -> None:
        """↑/↓, Home/End or a click in the list, the timeline or the panes."""
        self.select(event.rid)

    def _submit_workload(self, loaded) -> None:
        """Load it, and remember its file: the race (`r`) races the workload the app has loaded."""
        if loaded is not None:
            self.workload = loaded.path
        super()._submit_workload(loaded)

    def on_unmount(self) -> None:
        self.runner.stop()
