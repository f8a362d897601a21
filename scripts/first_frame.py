"""How long tinyllm-tui takes to put its first screen up: launch it on a pseudo-terminal, time
until the status line has been drawn, then until the engine is ready, then quit it.

    .venv/bin/python scripts/first_frame.py [--repeat 5] [-- tinyllm-tui args...]

Measures what a user sees: from the moment the command starts to the moment the terminal has
received the status line (" LOADING " or " RUNNING "/" PAUSED "), and to the first frame drawn
by a ready engine. Prints each run and the medians.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import re
import select
import statistics
import struct
import subprocess
import sys
import termios
import time

ANSI = re.compile(rb"\x1b\[[0-9;?]*[a-zA-Z]|\x1b[()][A-Z0-9]|\x1b[=>]")


def one_run(cmd: list[str], cols: int = 120, rows: int = 36, timeout: float = 60.0) -> tuple[float, float]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        close_fds=True,
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)},
    )
    os.close(slave)
    seen = b""
    first = ready = None
    try:
        while ready is None and time.perf_counter() - t0 < timeout:
            r, _, _ = select.select([master], [], [], 0.05)
            if not r:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            seen += chunk
            text = ANSI.sub(b"", seen)
            now = time.perf_counter() - t0
            if first is None and (b"LOADING" in text or b"RUNNING" in text or b"PAUSED" in text):
                first = now
            if first is not None and (b"RUNNING" in text or b"PAUSED" in text):
                ready = now
    finally:
        os.write(master, b"\x11")  # ctrl+q: quit
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.close(master)
    if first is None or ready is None:
        raise SystemExit(f"no status line within {timeout:.0f} s; output tail: {ANSI.sub(b'', seen)[-300:]!r}")
    return first, ready


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("args", nargs="*", help="arguments for tinyllm-tui (after --)")
    a = p.parse_args()
    exe = os.path.join(os.path.dirname(sys.executable), "tinyllm-tui")
    firsts, readies = [], []
    for i in range(a.repeat):
        first, ready = one_run([exe, *a.args])
        firsts.append(first)
        readies.append(ready)
        print(f"run {i + 1}: first frame {first:.2f} s, engine ready {ready:.2f} s", flush=True)
    print(
        f"median of {a.repeat}: first frame {statistics.median(firsts):.2f} s, "
        f"engine ready {statistics.median(readies):.2f} s ({' '.join(a.args) or 'default settings'})"
    )


if __name__ == "__main__":
    main()
