"""The prompt-file picker (F3): a typed path or a bundled workload, read and checked whole
before anything is sent; in a served app, typed paths only from the folders it allows."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from tinyllm.workload import (
    WorkItem,
    WorkloadError,
    bundled_workloads,
    load_workload,
    resolve_workload,
    tokenize_checked,
)
from tui.widgets.ordered_input import OrderedInput


@dataclass(frozen=True)
class LoadedWorkload:
    path: Path
    items: tuple[WorkItem, ...]
    tokens: tuple[tuple[int, ...], ...]


def read_workload(path: Path, encode, max_len: int, default_new: int) -> LoadedWorkload:
    """Parse + check a prompt file completely; WorkloadError with file:line on any problem."""
    items = load_workload(path)
    ids = tokenize_checked(items, path, encode, max_len, default_new)
    return LoadedWorkload(path, tuple(items), tuple(tuple(i) for i in ids))


class PromptPicker(ModalScreen["LoadedWorkload | None"]):
    """Type a path (or a bundled workload's name) and press Enter, or pick a bundled workload
    (shipped inside the package) below; a bad file is refused whole, with its line. Focus starts
    in the path field, so typing goes where the dialog says; a letter typed on the list goes
    there too; ↓ / Tab go to the list, where Enter loads the one highlighted."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        # priority: the field would take ↓ as a scroll; off on the list (its own ↓)
        Binding("down", "to_list", "The bundled workloads", show=False, priority=True),
    ]

    def __init__(self, encode, max_len: int, default_new: int):
        super().__init__()
        self.encode, self.max_len, self.default_new = encode, max_len, default_new
        self.files = list(bundled_workloads().values())

    def compose(self) -> ComposeResult:
        with Vertical(id="picker-box"):
            yield Label("Load a prompt workload (JSONL)", id="picker-title")
            yield OrderedInput(
                placeholder="a .jsonl file's path or a bundled name, then Enter",
                id="picker-path",
                select_on_focus=False,
            )  # (a letter from the list: added to)
            yield Static("", id="picker-error", markup=False)
            yield Label("…or pick a bundled one (↓ or Tab, then Enter):", id="picker-or")
            yield OptionList(
                *[Option(Text(f"{p.name}  ({_count_lines(p)} requests)"), id=str(p)) for p in self.files],
                id="picker-list",
            )

    def on_mount(self) -> None:
        self.set_focus(self.query_one("#picker-path"))

    def _try(self, path: Path) -> None:
        try:
            loaded = read_workload(path, self.encode, self.max_len, self.default_new)
        except WorkloadError as e:
            self._error(str(e))
            return
        self.dismiss(loaded)

    def _error(self, text: str) -> None:
        self.query_one("#picker-error", Static).update(Text(f"✗ {text}\nnothing was loaded", style="bold red"))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self._try(Path(event.option.id))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        typed = event.value.strip()
        if not typed:
            self._error("type a path to a .jsonl file first, or pick a bundled workload below (↓, Enter)")
            return
        roots = picker_roots()
        if roots and typed not in {p.stem for p in self.files} and not within(Path(typed), roots):
            # (said before looking: whether such a file exists is not told to a web visitor)
            self._error(f"{typed}: outside the folders this app reads files from ({', '.join(map(str, roots))})")
            return
        try:
            path = resolve_workload(typed)  # a file, else a bundled workload's name
        except WorkloadError:
            where = "" if Path(typed).expanduser().is_absolute() else f" (a relative path starts in {Path.cwd()})"
            self._error(f"{typed}: no such file{where}, nor a bundled workload's name (those are below)")
            return
        self._try(path)

    def on_key(self, event) -> None:
        """A letter typed on the list goes to the path field, as the dialog says."""
        field = self.query_one("#picker-path", Input)
        if event.is_printable and self.focused is not field:
            event.stop()
            self.set_focus(field)
            field.insert_text_at_cursor(event.character)

    def check_action(self, action: str, parameters) -> bool | None:
        if action == "to_list":
            return bool(self.files) and self.focused is self.query_one("#picker-path")
        return True

    def action_to_list(self) -> None:
        self.set_focus(self.query_one("#picker-list"))

    def action_cancel(self) -> None:
        self.dismiss(None)


def _count_lines(p: Path) -> int:
    try:
        return sum(1 for line in p.read_text(encoding="utf-8").splitlines() if line.strip())
    except (OSError, UnicodeDecodeError):
        return 0


PICKER_ROOTS_ENV = "TINYLLM_PICKER_ROOTS"  # set by tinyllm-tui --web for the apps it serves (tui/web.py)


def picker_roots() -> list[Path]:
    """The folders F3 may read typed paths from (None set: anywhere, as in a terminal of your own)."""
    value = os.environ.get(PICKER_ROOTS_ENV, "")
    return [Path(p).resolve() for p in value.split(os.pathsep) if p]


def within(path: Path, roots: list[Path]) -> bool:
    """Whether ``path`` (relative: from the working directory; links followed) is in one of ``roots``."""
    real = path.expanduser().resolve()
    return any(real == root or real.is_relative_to(root) for root in roots)
