"""A prompt typed and sent before the app has the terminal (tui/typeahead.py): the terminal keeps
its Enter as a carriage return (with ICRNL it became a line feed, which the editor took for
Ctrl+J, a new line: the prompt sat unsent) and does not echo it, and its settings come back as
they were; a background job leaves them alone (changing them would stop it)."""

from __future__ import annotations

import contextlib
import io
import os
import select
import subprocess
import sys
import termios
import tty

import pytest

from tui.typeahead import enter_stays_enter


def typed_before_raw_mode(keys: bytes, keep_enter: bool) -> bytes:
    """What the app reads of ``keys``, typed into a fresh terminal while it starts: then it goes
    raw (as Textual does) and reads what is waiting."""
    master, slave = os.openpty()
    with os.fdopen(slave, "rb", buffering=0, closefd=False) as stream:
        try:
            attrs = termios.tcgetattr(slave)
            attrs[0] |= termios.ICRNL  # a terminal as a shell leaves it
            termios.tcsetattr(slave, termios.TCSANOW, attrs)
            with enter_stays_enter(stream) if keep_enter else contextlib.nullcontext():
                inside = termios.tcgetattr(slave)
                assert bool(inside[0] & termios.ICRNL) != keep_enter and bool(inside[3] & termios.ECHO) != keep_enter
                inside[3] |= termios.ECHO  # (echo on, to see when the terminal has taken the keys in)
                termios.tcsetattr(slave, termios.TCSANOW, inside)
                os.write(master, keys)  # typed while the app loads
                echoed = b""  # the terminal has taken them in once it has echoed them all
                while len(echoed) < len(keys) and select.select([master], [], [], 2)[0]:
                    echoed += os.read(master, 1024)
                tty.setraw(slave, termios.TCSANOW)  # the app takes the terminal, keeping what was typed
                got = b""
                while len(got) < len(keys) and select.select([slave], [], [], 2)[0]:
                    got += os.read(slave, 1024)
            if keep_enter:
                assert termios.tcgetattr(slave) == attrs  # put back as it was, ICRNL included
            return got
        finally:
            os.close(master)
            os.close(slave)


def test_enter_typed_while_the_app_starts_stays_enter():
    assert typed_before_raw_mode(b"ROMEO:\r", keep_enter=False) == b"ROMEO:\n"  # the defect, as terminals do
    assert typed_before_raw_mode(b"ROMEO:\r", keep_enter=True) == b"ROMEO:\r"


def test_a_background_job_leaves_the_terminal_alone(monkeypatch):
    """tinyllm-tui --web & must not stop on SIGTTOU for changing a terminal it does not own."""
    master, slave = os.openpty()
    try:
        before = termios.tcgetattr(slave)
        monkeypatch.setattr(os, "tcgetpgrp", lambda fd: os.getpgrp() + 1)  # another job in the foreground
        with enter_stays_enter(os.fdopen(slave, "rb", buffering=0, closefd=False)):
            assert termios.tcgetattr(slave) == before
    finally:
        os.close(master)
        os.close(slave)


@pytest.mark.parametrize("stream", [io.StringIO(), None])
def test_without_a_terminal_nothing_is_touched(stream, monkeypatch):
    if stream is None:  # stdin closed, as under some process managers
        monkeypatch.setattr("sys.stdin", None)
    with enter_stays_enter(stream):
        pass


def test_the_command_keeps_enter_before_it_imports_the_app(monkeypatch):
    """`tinyllm-tui` is tui.launch, which takes the terminal before tui.cli and Textual load (a
    few tenths of a second in which a typed Enter was lost), and gives it back afterwards."""
    import tomllib
    from pathlib import Path

    import tui.cli
    import tui.launch

    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["tinyllm-tui"] == "tui.launch:main"
    loaded = "import sys, tui.launch; print(sorted(m for m in ('tui.cli', 'textual', 'torch') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", loaded], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr  # (a fresh interpreter: this one has them)
    master, slave = os.openpty()
    try:
        attrs = termios.tcgetattr(slave)
        attrs[0] |= termios.ICRNL
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        seen = []
        monkeypatch.setattr("sys.stdin", os.fdopen(slave, "r", closefd=False))
        monkeypatch.setattr(tui.cli, "main", lambda: seen.append(termios.tcgetattr(slave)[0]) or 7)
        assert tui.launch.main() == 7
        assert not seen[0] & termios.ICRNL and termios.tcgetattr(slave) == attrs
    finally:
        os.close(master)
        os.close(slave)
