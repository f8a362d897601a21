"""`tinyllm-tui`'s entry point. It takes the terminal's Enter (tui/typeahead.py) before anything
else is imported, so a prompt typed and sent while the command starts is sent: the imports of
tui.cli and Textual take a few tenths of a second, during which a typed Enter would otherwise
be stored as a line feed, the editor's "new line"."""

from __future__ import annotations


def main() -> int:
    from tui.typeahead import enter_stays_enter

    with enter_stays_enter():
        from tui.cli import main as run

        return run()
