"""--kv-events against a vLLM started with the same concrete endpoint: both sides connect and
never meet (vLLM binds only a wildcard). After a few seconds with nothing, the viewer says so
instead of "connecting" forever."""

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from tui.runners import kv_subscriber  # noqa: E402
from tui.runners.kv_subscriber import KVEventsSubscriber  # noqa: E402


def test_connecting_with_nothing_for_a_while_says_how_vllm_binds(monkeypatch):
    sub = KVEventsSubscriber("tcp://127.0.0.1:5999")
    assert sub._status() == "connecting"
    now = kv_subscriber.time.monotonic()
    monkeypatch.setattr(kv_subscriber.time, "monotonic", lambda: now + kv_subscriber.HINT_AFTER_S + 1)
    said = sub._status()
    assert said.startswith("connecting: nothing yet") and "tcp://*:PORT" in said
