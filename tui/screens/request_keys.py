"""What the user does to requests: type a prompt, load a prompt file, set the next request's
settings, abort one or all (asking first before touching another client's requests on a shared
server), clear the prefix cache. A mixin of the app: these act through ``runner.send`` only."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.widgets import Static

from tinyllm.request import ContextTooLong, RequestSettings, check_fits
from tui.runners.interface import Abort, AbortAll, ClearPrefixCache, LoadWorkload, Submit
from tui.screens.modals import Confirm, QuitConfirm
from tui.screens.picker import LoadedWorkload, PromptPicker, read_workload
from tui.screens.settings import SettingsScreen


class RequestKeys:
    """Needs ``runner``, ``tokenizer``, ``settings``, ``max_len``, ``remote``, ``metrics_only``,
    ``selected``, ``select``, ``notify``, ``push_screen``, ``_close_help``."""

    ACTIVE = ("queued", "running", "preempted")

    def submit_prompt(self, text: str) -> bool:
        """Send ``text`` (the prompt editor's, as it was when Enter was pressed) as a request;
        False, with the reason shown, when it is not sent (the editor then keeps it)."""
        if not text.strip():
            self.notify("Type some text first: the model continues it.", severity="warning")
            return False
        if self.remote and self.runner.frame.status.startswith("disconnected"):  # kept in the input
            self.notify(
                f"the server at {self.runner.url} is not reachable; the app is reconnecting (the prompt "
                "stays in the input: Enter sends it once the status says ATTACHED)",
                title="not sent",
                severity="error",
                timeout=8,
            )
            return False
        ids = None
        if self.tokenizer is not None:  # attached without one: the server checks
            ids = self.tokenizer.encode(text)
            try:
                check_fits(len(ids), self.settings.max_new_tokens, self.max_len, "the context")
            except ContextTooLong as e:
                self.notify(f"{e} (F2: settings)", title="not sent", severity="error", timeout=8)
                return False
        s = self.settings
        self.runner.send(Submit(text, s, None if self.remote or ids is None else tuple(ids)))
        self._following = True  # the selection goes to it when it arrives
        if self.runner.frame.status == "loading":  # no frame comes until the engine is up: say it waits
            self.redraw_status()
        return True

    def _others(self, rids: list[int]) -> list[int]:
        """Of ``rids``, those another client of the attached server sent (none for a local
        engine, a replay, or a vLLM server, whose list holds this app's requests only)."""
        if not self.remote or self.metrics_only:
            return []
        ours = self.runner.ours()
        return [rid for rid in rids if rid not in ours]

    def action_abort_selected(self) -> None:
        """Abort the selected request, the one the screen shows; one already done is not offered
        (it said 'Abort #4?' for a finished request, then that there was nothing to abort)."""
        rid = self.selected
        if rid is None:
            self.notify("No request selected: highlight one in the Requests list.", severity="warning")
            return
        if not self._abortable(rid):
            return
        if self._others([rid]):

            def done(yes) -> None:
                if yes and self._abortable(rid):  # (it may have finished while the dialog was up)
                    self.runner.send(Abort(rid))

            self.push_screen(
                Confirm(
                    f"Abort #{rid}?",
                    f"#{rid} belongs to another client of the server: "
                    f"its client gets the text so far, with finish_reason abort.",
                    [("y", f"Abort #{rid}", True)],
                ),
                done,
            )
            return
        self.runner.send(Abort(rid))

    def _abortable(self, rid: int) -> bool:
        """Whether #rid is queued or running now; if not, say so (and how to abort another)."""
        v = self.runner.frame.snapshot.request(rid)
        if v is not None and v.state in self.ACTIVE:
            return True
        state = "gone" if v is None else v.state
        self.notify(
            f"#{rid} is {state}: nothing to abort. Select a queued or running request (↑/↓ in the "
            f"Requests list), or Ctrl+K to abort them all.",
            title="not aborted",
            severity="warning",
            timeout=5,
        )
        return False

    def action_abort_all(self) -> None:
        active = [v.rid for v in self.runner.frame.snapshot.requests if v.state in self.ACTIVE]
        others = self._others(active)
        if not others:
            self.runner.send(AbortAll())
            return
        ours = len(active) - len(others)

        def done(choice) -> None:
            if choice is not None:
                self.runner.send(AbortAll(ours_only=choice == "ours"))

        self.push_screen(
            Confirm(
                "Abort all?",
                f"{len(active)} requests are queued or running on the server: {ours} from this app, "
                f"{len(others)} from other clients (each of those gets its text so far, finish_reason abort).",
                [("o", f"Abort this app's {ours}", "ours")] * bool(ours) + [("a", f"Abort all {len(active)}", "all")],
            ),
            done,
        )

    def action_clear_prefix_cache(self) -> None:
        self.runner.send(ClearPrefixCache())

    def action_settings(self) -> None:
        self._close_help()

        def done(result: RequestSettings | None) -> None:
            if result is not None:
                self.settings = result
                self._show_settings()
                self.notify(f"Next requests: {result.describe()}", timeout=3)

        self.push_screen(SettingsScreen(self.settings, self.max_len - 1, self._engine_settings()), done)

    def _engine_settings(self) -> str:
        snap = self.runner.frame.snapshot
        budget = snap.max_batched_tokens
        sched = (
            f"chunked prefill, ≤{budget} tokens/step (--max-batched-tokens, --no-chunked-prefill), "
            f"prefix cache {'on' if snap.kv.block_cached else 'off'} (--[no-]prefix-cache)"
            if budget
            else "prefill then decode (--chunked-prefill for the token budget)"
        )
        return f"Engine (set at start): {snap.n_slots} slots, {snap.kv.kind} KV, {sched}"

    def action_load_prompts(self) -> None:
        self._close_help()
        picker = PromptPicker(self.tokenizer.encode, self.max_len, self.settings.max_new_tokens)
        self.push_screen(picker, self._submit_workload)

    def _load_path(self, path: Path) -> None:
        from tinyllm.workload import WorkloadError

        try:
            loaded = read_workload(path, self.tokenizer.encode, self.max_len, self.settings.max_new_tokens)
        except WorkloadError as e:
            self.notify(f"{e}\nnothing was loaded", title="prompt file refused", severity="error", timeout=10)
            return
        self._submit_workload(loaded)

    def _submit_workload(self, loaded: LoadedWorkload | None) -> None:
        if loaded is None:
            return
        s = self.settings
        self.runner.send(LoadWorkload(loaded.path.name, loaded.items, loaded.tokens, s))
        self.notify(f"{loaded.path.name}: {len(loaded.items)} requests", title="workload loaded", timeout=3)

    async def action_quit(self) -> None:
        """q, Ctrl+C, Ctrl+Q. With requests still to run or a recording being written, ask once:
        the same key again, or y, quits; Esc stays. Nothing to lose: quit at once."""
        if isinstance(self.screen, QuitConfirm):  # the second press
            self.screen.dismiss(True)
            return
        lost = self._quit_loses()
        if not lost:
            self._quit_now()
            return
        self._close_help()

        def done(yes) -> None:
            if yes:
                self._quit_now()

        self.push_screen(QuitConfirm(lost), done)

    def _quit_now(self) -> None:
        self.runner.stop()
        self.exit()

    def _quit_loses(self) -> list[str]:
        """What quitting now would end: requests not done, arrivals still to come, a recording."""
        if self.replay:
            return []
        frame = self.runner.frame
        active = sum(v.state in self.ACTIVE for v in frame.snapshot.requests)
        out = []
        if active:
            one = active == 1
            what = "of this app's requests" if self.remote else ("request" if one else "requests")
            out.append(
                f"{active} {what} {'is' if one else 'are'} queued or running: "
                f"{'it stops' if one else 'they stop'} when the app quits"
            )
        if frame.pending_arrivals:
            out.append(
                f"{frame.pending_arrivals} of the workload's requests {'has' if frame.pending_arrivals == 1 else 'have'} "
                "not arrived yet"
            )
        if self.recording is not None:
            out.append(f"--record {self.recording} is being written: quitting closes it")
        return out

    def recording_note(self) -> str | None:
        """After the app has exited, the line main() prints about --record's file. One cut short
        before anything was recorded (quit while the engine loaded) is removed: there was nothing
        to replay, and --record would refuse the name next time."""
        if self.recording is None:
            return None
        from tinyllm.observe.recording import RecordingError, read_recording

        path = self.recording
        try:
            records = [rec for _, rec in read_recording(path)[1]] if path.exists() else None
        except RecordingError:
            records = []  # the header itself cut short
        if not any(rec["step"] or "prompt" in rec or "life" in rec for rec in records or ()):  # no step, no request
            if records is not None:
                path.unlink(missing_ok=True)
            return (
                f"tinyllm-tui: nothing was recorded (the app quit before the engine's first step); "
                f"{'removed ' + str(path) if records is not None else str(path) + ' was not written'}"
            )
        steps = self.runner.frame.snapshot.counters.steps
        return (
            f"tinyllm-tui: recorded {steps} steps to {path.resolve()} "
            f"(tinyllm-tui --replay {path}; tinyllm trace {path})"
        )

    def _show_settings(self) -> None:
        self.query_one("#next-settings", Static).update(Text(self.settings.describe(), style="dim"))
