"""Subscribe to a vLLM server's KV-cache events in a background thread (ZMQ SUB).

vLLM's ``ZmqEventPublisher`` sends each batch as three frames: topic, an 8-byte big-endian
sequence number, the msgpack batch. The thread applies them to a ``CacheBook`` and hands a fresh
``CacheView`` to ``on_view`` at most every ``publish_s`` (and about once a second anyway, so the
idle time and fading eviction marks stay true); the runner puts it in its next frame.

ZMQ reconnects by itself, so a restarted server just resumes (its sequence starts again: the book
clears). A socket monitor says whether a publisher is connected at all. The receive loop polls with
a timeout so ``stop()`` is prompt. A message that is not a batch is counted and skipped: nothing a
publisher sends can end the thread. pyzmq and msgspec are optional (the ``vllm-events`` extra).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from tinyllm.observe.kv_events import CacheBook, CacheView, decode

POLL_MS = 200
IDLE_S = 5.0  # no batch for this long: "idle" (vLLM sends one per step that changed the cache)
ENDPOINT = re.compile(r"^(tcp://[^\s:/*]+:\d{1,5}|ipc://\S+)$")


def check_endpoint(endpoint: str) -> str:
    """ValueError with the fix if ``endpoint`` is not something a SUB socket can connect to."""
    if "*" in endpoint:
        raise ValueError(
            f"{endpoint} is the address vLLM binds; connect to the host, e.g. {endpoint.replace('*', '127.0.0.1')}"
        )
    if not ENDPOINT.match(endpoint) or (endpoint.startswith("tcp") and not 0 < int(endpoint.rsplit(":", 1)[1]) < 65536):
        raise ValueError(f"{endpoint}: expected tcp://HOST:PORT (vLLM's kv-events endpoint) or ipc://PATH")
    return endpoint


# vLLM's publisher binds only a wildcard endpoint (tcp://*:PORT) and otherwise connects: started with
# the same concrete address as this viewer, both connect and never meet. Said once nothing came.
HINT_AFTER_S = 5.0
WILDCARD_HINT = "nothing yet; start vLLM's --kv-events-config endpoint as tcp://*:PORT (it binds only a wildcard)"


class KVEventsSubscriber:
    """The background subscriber (see the module docstring). ``view`` is the newest CacheView."""

    def __init__(self, endpoint: str, publish_s: float = 0.1, idle_s: float = IDLE_S):
        self.endpoint = endpoint
        self.publish_s, self.idle_s = publish_s, idle_s
        self.on_view: Callable[[CacheView], None] = lambda view: None
        self._book = CacheBook(endpoint)
        self._connected = False
        self._failed = ""  # the thread stopped on an error: why
        self._view = CacheView(endpoint)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._since = time.monotonic()  # when it started connecting (the hint after HINT_AFTER_S)

    @property
    def view(self) -> CacheView:
        return self._view

    def start(self) -> KVEventsSubscriber:
        self._thread = threading.Thread(target=self._run, daemon=True, name="kv-events")
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the thread --------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except Exception as e:  # noqa: BLE001 - say so on screen, never a traceback
            self._failed = f"failed: {type(e).__name__}: {e}"
            self._publish()

    def _loop(self) -> None:
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 100_000)  # vLLM's own PUB high-water mark
        sub.setsockopt(zmq.SUBSCRIBE, b"")  # every topic
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sub.connect(self.endpoint)
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        last = 0.0
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(POLL_MS))
                changed = False
                if monitor in ready:
                    changed |= self._watch(monitor)
                if sub in ready:
                    changed |= self._drain(sub)
                now = time.monotonic()
                if (changed and now - last >= self.publish_s) or now - last >= 1.0:
                    self._publish()
                    last = now
        finally:
            sub.disable_monitor()
            monitor.close(0)
            sub.close(0)
            ctx.term()

    def _watch(self, monitor: zmq.Socket) -> bool:
        while monitor.poll(0):
            event = recv_monitor_message(monitor)["event"]
            self._connected = event == zmq.EVENT_CONNECTED
        return True

    def _drain(self, sub: zmq.Socket, most: int = 1000) -> bool:
        """Apply what has arrived (at most ``most`` messages, then draw)."""
        for _ in range(most):
            try:
                parts = sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self.handle(parts)
        return True

    def handle(self, parts: list[bytes]) -> None:
        """One message: (topic, sequence, payload). Anything else is counted as bad."""
        book = self._book
        if len(parts) != 3 or len(parts[1]) != 8:
            book.bad(f"expected 3 frames (topic, 8-byte sequence, batch), got {len(parts)}")
            return
        try:
            batch = decode(parts[2])
        except ValueError as e:  # msgspec's DecodeError and ValidationError
            book.bad(f"not a KV event batch: {e}")
            return
        try:
            book.sequence(int.from_bytes(parts[1], "big", signed=True))
            book.apply(batch)
        except Exception as e:  # noqa: BLE001 - a publisher must not end the thread
            book.bad(f"{type(e).__name__}: {e}")

    def _status(self) -> str:
        if self._failed:
            return self._failed
        age = self._book.last_event_t
        if age is not None and time.monotonic() - age < self.idle_s and self._connected:
            return "receiving"
        if self._connected:
            return "idle" if age is not None else "connected"
        if age is not None:
            return "disconnected"
        if time.monotonic() - self._since > HINT_AFTER_S and "*" not in self.endpoint:
            return f"connecting: {WILDCARD_HINT}"
        return "connecting"

    def _publish(self) -> None:
        self._view = self._book.view(self._status())
        try:
            self.on_view(self._view)
        except Exception:  # noqa: BLE001 - the viewer's problem, not ours
            pass
