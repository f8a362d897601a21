"""What 8 concurrent hostile 1 MiB bodies do to everyone else: `tinyllm serve` (the bundled model,
a process of its own) gets, at once, 3 bodies of 300k nested lists, 3 chats of 30k messages and 2
/tokenize requests of a 1 MiB text, while this script times /health (every 20 ms, from a process of
its own) and a 4-token completion. Three rounds; prints each round's worst /health and the completion's time.

    .venv/bin/python scripts/hostile_bodies.py
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import httpx

MODEL = "tinyllm-shakespeare"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hostile() -> list[tuple[str, bytes]]:
    nested = b'{"model": "%s", "prompt": [' % MODEL.encode() + b"[]," * 300_000 + b"[]]}"
    chat = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}] * 30_000}).encode()
    text = json.dumps({"prompt": "ROMEO: " * 149_000}).encode()
    return [("/v1/completions", nested)] * 3 + [("/v1/chat/completions", chat)] * 3 + [("/tokenize", text)] * 2


PROBE = """
import sys, time, httpx
url, worst, end = sys.argv[1], 0.0, time.monotonic() + float(sys.argv[2])
with httpx.Client(timeout=60) as c:
    while time.monotonic() < end:
        t = time.perf_counter()
        c.get(url + "/health")
        worst = max(worst, time.perf_counter() - t)
        time.sleep(0.02)
print(worst)
"""


def round_(url: str) -> tuple[float, float, list[int]]:
    """One round; /health is timed from a process of its own (this one's threads share a lock)."""
    bodies, statuses = hostile(), []
    probe = subprocess.Popen([sys.executable, "-c", PROBE, url, "4"], stdout=subprocess.PIPE, text=True)

    def send(path: str, body: bytes) -> None:
        r = httpx.post(url + path, content=body, headers={"content-type": "application/json"}, timeout=120)
        statuses.append(r.status_code)

    time.sleep(1.0)  # the probe is running
    threads = [threading.Thread(target=send, args=b) for b in bodies]
    for t in threads:
        t.start()
    time.sleep(0.05)  # the hostile bodies are on their way
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "ROMEO:", "max_tokens": 4}, timeout=120)
    completion = time.perf_counter() - t0
    assert r.status_code == 200, r.text
    for t in threads:
        t.join()
    worst = float(probe.communicate(timeout=60)[0])
    return worst, completion, sorted(statuses)


def main() -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tinyllm.cli", "serve", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        for i in range(3):
            worst, completion, statuses = round_(url)
            print(
                f"round {i + 1}: /health worst {worst * 1000:.0f} ms, 4-token completion {completion * 1000:.0f} ms, hostile answered {statuses}"
            )
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
