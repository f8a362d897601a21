"""tinyllm-tui --web in a real browser: headless Chromium (driven by Playwright) opens the page,
watches the race stream, pauses and resumes it with keys, and closing the tab ends the tab's app
and its engine process. Skipped where Chromium or Playwright is not installed.

The terminal in the page is drawn on a canvas (xterm.js), so the test reads the screen as pixels:
while the race runs, screenshots a moment apart differ; paused, they are identical.
Set TINYLLM_WEB_SHOT=FILE to keep the screenshot of the running race (docs/race-web.png).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.web
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no Chromium installed (Debian: apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            parent[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = {c for c, pp in parent.items() if pp == p}
        out |= kids
        todo += kids
    return out


def wait_for(cond, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def shot(page) -> bytes:
    return page.screenshot()


def changes(page, gap: float = 1.0) -> bool:
    a = shot(page)
    time.sleep(gap)
    return shot(page) != a


@pytest.mark.over_budget(
    "the one end-to-end test of --web: a real headless Chromium, the web server and the app and race processes it starts for the tab"
)
def test_the_race_streams_in_a_browser_and_the_tab_owns_its_engine(tmp_path):
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tui.cli",
            "--web",
            "--port",
            str(port),
            "--race",
            "mixed_lengths",
            "--step-delay",
            "20",
            "--threads",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "TINYLLM_WEB_TOKEN": "browser-test"},  # the token the page's URL carries
    )
    try:

        def listening() -> bool:
            assert server.poll() is None, server.stdout.read().decode(errors="replace")
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_for(listening, 60, "the web server")
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 860})
            page.goto(f"http://127.0.0.1:{port}/?fontsize=14&token=browser-test")
            wait_for(lambda: len(descendants(server.pid)) >= 2, 60, "the tab's app and its engine process")
            page.wait_for_selector(".textual-terminal canvas", timeout=60_000)
            # streaming: the screen changes in three half-second windows in a row (the loading
            # screen changes too, once or twice, then stands still while the engine warms up)
            wait_for(lambda: all(changes(page, 0.5) for _ in range(3)), 120, "the race to stream")
            if os.environ.get("TINYLLM_WEB_SHOT"):  # the README's picture: well into the race
                time.sleep(12.0)
            image = tmp_path / "race-web.png"
            page.screenshot(path=str(image))
            if os.environ.get("TINYLLM_WEB_SHOT"):
                shutil.copy(image, os.environ["TINYLLM_WEB_SHOT"])
            page.mouse.click(700, 430)  # focus the terminal
            page.keyboard.press("Space")  # pause the race
            wait_for(lambda: not changes(page, 1.0), 30, "the paused race to settle")  # (a frame in flight)
            assert not changes(page, 1.5), "paused, yet the screen kept changing"
            page.keyboard.press("Space")  # resume
            wait_for(lambda: changes(page), 30, "the race to stream again")
            kids = descendants(server.pid)
            page.close()  # the tab goes: its app and engine too
            wait_for(lambda: not (kids & descendants(server.pid)), 30, "the tab's processes to end")
            browser.close()
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
