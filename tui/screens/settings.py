"""The next request's settings: sampling, stops, priority and tenant, each field validated;
a wrong value is explained in the dialog and nothing is applied."""

from __future__ import annotations

from dataclasses import replace

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Static

from tinyllm.request import MAX_LOGPROBS, PRIORITY_LIMIT, SEED_MAX, SEED_MIN, RequestSettings, Sampling, check_tenant
from tinyllm.stops import format_stop_list, parse_stop_list
from tui.widgets.ordered_input import OrderedInput


class SettingsScreen(ModalScreen["RequestSettings | None"]):
    """Validated fields; a wrong value is explained here and nothing is applied."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        # priority: the focus moves before the next key is handed out (as a field's
        # binding, keys typed right after Tab, or pasted, went to the field it left)
        Binding("tab", "app.focus_next", "Next field", show=False, priority=True),
        Binding("shift+tab", "app.focus_previous", "Previous field", show=False, priority=True),
    ]

    def __init__(self, current: RequestSettings, max_new_limit: int, engine: str = ""):
        """``engine``: the engine's own settings (scheduler, KV), shown read-only: they are fixed
        when the engine is built, so the line says which flags change them."""
        super().__init__()
        self.current = current
        self.max_new_limit = max_new_limit
        self.engine = engine

    def compose(self) -> ComposeResult:
        s = self.current.sampling
        with Vertical(id="settings-box"):
            yield Label("Settings for the next request", id="settings-title")
            for label, ident, value, hint in (
                ("temperature", "temperature", f"{s.temperature:g}", "0 = greedy, any number >= 0"),
                ("top_k", "top_k", "" if s.top_k is None else str(s.top_k), "integer >= 1, blank = off"),
                ("top_p", "top_p", "" if s.top_p is None else f"{s.top_p:g}", "number in (0, 1], blank = off"),
                (
                    "max_new_tokens",
                    "max_new",
                    str(self.current.max_new_tokens),
                    f"integer in [1, {self.max_new_limit}]",
                ),
            ):
                with Horizontal(classes="field compact" if ident == "max_new" else "field"):  # 80x24: one row
                    yield Label(label, classes="field-label")
                    yield OrderedInput(value, id=ident, classes="field-input")
                    yield Label(hint, classes="field-hint")
            c = self.current
            seed = "" if s.seed is None else str(s.seed)
            for pair in (
                (("min_p", f"{s.min_p:g}"), ("seed", seed)),
                (("presence_penalty", f"{s.presence_penalty:g}"), ("frequency_penalty", f"{s.frequency_penalty:g}")),
                (("repetition_penalty", f"{s.repetition_penalty:g}"), ("min_tokens", str(c.min_tokens))),
            ):
                with Horizontal(classes="field compact"):
                    for ident, value in pair:
                        yield Label(ident.replace("_penalty", " pen."), classes="field-label")
                        yield OrderedInput(value, id=ident, classes="field-input")
            with Horizontal(classes="field compact"):
                yield Label("stop  a|b \\n", classes="field-label")  # stop strings: | between, \n newline
                yield OrderedInput(format_stop_list(c.stop), id="stop", classes="field-input stop-input")
                yield Label("logprobs", classes="field-label")
                yield OrderedInput("" if c.logprobs is None else str(c.logprobs), id="logprobs", classes="field-input")
            with Horizontal(classes="field compact"):
                yield Label("priority", classes="field-label")
                yield OrderedInput(str(c.priority), id="priority", classes="field-input")
                yield Label("tenant", classes="field-label")
                yield OrderedInput(c.tenant, id="tenant", classes="field-input")
            yield Checkbox("stop at end-of-text", self.current.stop_at_eos, id="stop_at_eos")
            if self.engine:
                yield Static(Text(self.engine, style="dim"), id="settings-engine")
            yield Static("", id="settings-error", markup=False)
            with Horizontal(id="settings-buttons"):
                yield Button("Apply", variant="primary", id="apply")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#temperature", Input).focus()

    def parse(self) -> RequestSettings:
        """The settings in the form, or ValueError saying which field is wrong and why."""

        def val(ident: str) -> str:
            return self.query_one(f"#{ident}", Input).value.strip()

        def num(ident: str, kind, blank_ok: bool, ok, allowed: str):
            """The field's value, or ValueError in the dialog's own words (its hint's)."""
            raw = val(ident)
            if raw == "" and blank_ok:
                return None
            name = ident.replace("max_new", "max_new_tokens")
            try:
                x = kind(raw)
            except ValueError:
                x = None
            if x is None or not ok(x):
                raise ValueError(f"{name} must be {allowed}, got {raw!r}")
            return x

        sampling = Sampling(
            num("temperature", float, False, lambda t: 0 <= t < float("inf"), "a number >= 0 (0 = greedy)"),
            num("top_k", int, True, lambda k: k >= 1, "a whole number >= 1, or blank for off"),
            num("top_p", float, True, lambda p: 0 < p <= 1, "a number in (0, 1], or blank for off"),
        )
        new = num(
            "max_new",
            int,
            False,
            lambda n: 1 <= n <= self.max_new_limit,
            f"a whole number from 1 to {self.max_new_limit}",
        )
        pen = "a number from -2 to 2 (0 = off)"
        sampling = replace(
            sampling,
            min_p=num("min_p", float, False, lambda x: 0 <= x <= 1, "a number in [0, 1] (0 = off)"),
            seed=num("seed", int, True, lambda x: SEED_MIN <= x <= SEED_MAX, "a whole number, or blank for none"),
            presence_penalty=num("presence_penalty", float, False, lambda x: -2 <= x <= 2, pen),
            frequency_penalty=num("frequency_penalty", float, False, lambda x: -2 <= x <= 2, pen),
            repetition_penalty=num(
                "repetition_penalty", float, False, lambda x: 0 < x < float("inf"), "a number > 0 (1 = off)"
            ),
        )
        min_tokens = num(
            "min_tokens", int, False, lambda x: 0 <= x <= new, f"a whole number from 0 to max_new_tokens ({new})"
        )
        priority = num(
            "priority",
            int,
            False,
            lambda x: -PRIORITY_LIMIT < x < PRIORITY_LIMIT,
            "a whole number (lower runs first under --scheduling-policy priority)",
        )
        tenant = check_tenant(val("tenant"))
        return replace(
            self.current,
            sampling=sampling,
            max_new_tokens=new,
            stop=parse_stop_list(val("stop")),
            stop_at_eos=self.query_one("#stop_at_eos", Checkbox).value,
            min_tokens=min_tokens,
            priority=priority,
            tenant=tenant,
            logprobs=num(
                "logprobs",
                int,
                True,
                lambda x: 0 <= x <= MAX_LOGPROBS,
                f"a whole number from 0 to {MAX_LOGPROBS}, or blank for off",
            ),
        )

    def _apply(self) -> None:
        try:
            settings = self.parse()
        except ValueError as e:
            self.query_one("#settings-error", Static).update(Text(f"✗ {e}", style="bold red"))
            return
        self.dismiss(settings)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "apply":
            self._apply()
        else:
            self.dismiss(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._apply()

    def action_cancel(self) -> None:
        self.dismiss(None)
