"""A vLLM server's prefix cache from its KV-cache events: the subscriber, the state, the panel.

Batches are encoded here with the same msgspec Structs vLLM 0.32.0 publishes
(``vllm/distributed/kv_events.py``, copied below, not shared with the decoder under test) and sent
through a real ZMQ PUB socket on loopback, as vLLM's ``ZmqEventPublisher`` sends them: (topic,
8-byte big-endian sequence number, msgpack batch). The test marked ``vllm`` runs against a real
vLLM server when VLLM_URL and VLLM_KV_EVENTS are set (see the README), and is skipped otherwise.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import httpx
import pytest

msgspec = pytest.importorskip("msgspec")
zmq = pytest.importorskip("zmq")

from tests.test_app import _watch, no_unexpected_errors, submit, until  # noqa: E402,F401
from tests.test_attach_vllm import fake  # noqa: E402,F401
from tinyllm.observe.kv_events import EVICTED_MARK_S, CacheBook, decode  # noqa: E402
from tinyllm.request import RequestSettings, Sampling  # noqa: E402
from tui.app import TinyLLMApp  # noqa: E402
from tui.cli import build_app  # noqa: E402
from tui.runners.kv_subscriber import KVEventsSubscriber, check_endpoint  # noqa: E402
from tui.runners.vllm import VllmRunner  # noqa: E402
from tui.widgets.prefix_cache_map import PrefixCacheMap, layout  # noqa: E402


# -- vLLM 0.32.0's structures (vllm/distributed/kv_events.py), for encoding -----------------------
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


BS = 16
ENCODER = msgspec.msgpack.Encoder()


def h(n: int) -> bytes:
    """A block hash as vLLM 0.32 sends it by default: 32 bytes."""
    return n.to_bytes(32, "big")


def stored(hashes: list[int], parent: int | None, medium: str = "GPU", tokens: int | None = None) -> BlockStored:
    n = len(hashes) * BS if tokens is None else tokens
    return BlockStored(
        [h(x) for x in hashes],
        None if parent is None else h(parent),
        list(range(n)),
        BS if tokens is None else tokens,
        None,
        medium,
        None,
        group_idx=0,
    )


def removed(hashes: list[int], medium: str = "GPU") -> BlockRemoved:
    return BlockRemoved([h(x) for x in hashes], medium, group_idx=0)


class Publisher:
    """A ZMQ publisher on a free loopback port, sending what vLLM's publisher sends. An XPUB
    socket (a PUB that also sees subscriptions), so a test can wait until the subscriber is in."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.XPUB)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.seq = 0

    def send(self, *events, seq: int | None = None) -> None:
        self.seq = self.seq if seq is None else seq
        payload = ENCODER.encode(EventBatch(time.time(), list(events), 0))
        self.sock.send_multipart((b"kv-events", self.seq.to_bytes(8, "big"), payload))
        self.seq += 1

    def wait_subscribed(self, timeout_ms: int = 10_000) -> None:
        assert self.sock.poll(timeout_ms), "no subscriber came"
        assert self.sock.recv() == b"\x01"  # subscribe, to every topic

    def raw(self, *frames: bytes) -> None:
        self.sock.send_multipart(frames)

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def pub():
    p = Publisher()
    yield p
    p.close()


@pytest.fixture
def sub(pub):
    s = KVEventsSubscriber(pub.endpoint, publish_s=0.02).start()
    pub.wait_subscribed()
    yield s
    s.stop()


def wait_for(cond, what: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def panel_text(view, width: int = 60, rows: int = 6) -> str:
    w = PrefixCacheMap(max_rows=rows)
    w.view = view
    return w.render_text(width).plain


# -- the state and the panel, through a real socket ------------------------------------------------
def test_chains_forks_duplicates_and_evictions_through_a_socket(sub, pub):
    pub.send(stored([1, 2, 3], None))  # a prompt of 3 full blocks
    pub.send(stored([4, 5], 3), stored([6], 2))  # two continuations: 3 → 4 → 5, and 2 → 6
    pub.send(stored([10, 11], None))  # another prompt
    pub.send(stored([1, 2], None), stored([10], None))  # the same tokens computed again: second copies
    pub.send(removed([11]))  # evicted
    pub.send(removed([1]))  # one copy of 1 goes; the other holds it
    wait_for(lambda: sub.view.batches == 6, "six batches")
    v = sub.view
    assert v.status == "receiving" and v.bad == 0 and v.missed == 0
    assert v.blocks == 7 and v.tokens == 7 * BS and v.block_size == BS
    assert v.stored == 11 and v.removed == 2 and v.forks == 1 and v.duplicates == 2
    assert [c.cells for c in v.chains] == ["bsbbb,b", "dx"]  # 1, 2 (fork), 3, 4, 5, (branch) 6 | 10 (2 copies), 11 gone
    assert v.chains[0].head_tokens == tuple(range(8))
    text = panel_text(v, 80)
    assert "7 blocks × 16 · 112 tok · 2 chains · ▣ 1 shared · ▤ 2 dup · ✕ 1 evicted" in text
    # narrower, the figures of least use give way, whole (the header was cut at 120 columns)
    assert panel_text(v, 60).startswith("7 blocks × 16 · 112 tok · ▣ 1 shared · ✕ 1 evicted\n")
    assert "receiving · 6 batches · 11 stored · 2 removed · 0 cleared" in text
    assert "■▣■■■╎■ ▤✕" in text
    pub.send(removed([1]))  # the last copy of 1: now it is gone
    wait_for(lambda: sub.view.batches == 7, "the last copy's removal")
    assert [(c.cells, c.partial) for c in sub.view.chains] == [("x", False), ("sbbb,b", True), ("dx", False)]


def test_garbage_is_counted_never_fatal(sub, pub):
    pub.raw(b"just one frame")
    pub.raw(b"kv-events", b"\x00" * 8, b"\xc1 not msgpack")
    pub.raw(b"kv-events", b"\x00" * 8, ENCODER.encode({"ts": 1.0, "events": []}))  # a map, not vLLM's array
    pub.raw(b"kv-events", b"\x00" * 8, ENCODER.encode([1.0, [{"type": "BlockExploded"}]]))
    pub.raw(b"kv-events", b"\x00" * 8, ENCODER.encode([1.0, [{"type": "BlockStored", "block_hashes": "x"}]]))
    wait_for(lambda: sub.view.bad == 5, "five bad messages")
    pub.send(stored([1], None), seq=0)  # and the next good batch still counts
    wait_for(lambda: sub.view.blocks == 1, "a good batch after the garbage")
    assert sub.view.bad == 5 and "not a KV event batch" in sub.view.last_error
    assert "5 bad messages" in panel_text(sub.view) and sub._thread.is_alive()


def test_a_gap_counts_missed_batches_and_a_restart_clears(sub, pub):
    pub.send(stored([1, 2], None), seq=0)
    pub.send(stored([3], 2), seq=4)  # 1, 2 and 3 lost on the way
    wait_for(lambda: sub.view.batches == 2, "two batches")
    assert sub.view.missed == 3 and sub.view.blocks == 3
    pub.send(stored([7], None), seq=0)  # a restarted server: its cache starts empty
    wait_for(lambda: sub.view.batches == 3, "the restarted server's batch")
    v = sub.view
    assert v.restarts == 1 and v.blocks == 1 and [c.cells for c in v.chains] == ["b"]
    assert "3 batches missed · 1 restarts" in panel_text(v)


def test_all_blocks_cleared_and_removed_blocks_we_never_saw(sub, pub):
    pub.send(stored([1, 2, 3], None), stored([4], 3))
    pub.send(removed([99]))  # cached before we subscribed
    pub.send(AllBlocksCleared())
    wait_for(lambda: sub.view.batches == 3, "three batches")
    v = sub.view
    assert v.blocks == 0 and v.chains == () and v.cleared == 1 and v.unknown_removed == 1
    assert "nothing cached yet" in panel_text(v) and "1 removed unseen" in panel_text(v)


def test_partial_offloaded_and_orphaned_blocks():
    book = CacheBook("x")
    book.apply(
        decode(
            ENCODER.encode(
                EventBatch(
                    0.0,
                    [
                        stored([1, 2], None),
                        stored([3], 2, tokens=5),
                        stored([1], None, medium="CPU"),
                        stored([20, 21], 19),
                    ],
                )
            )
        )
    )
    book.apply(decode(ENCODER.encode(EventBatch(0.0, [removed([1])]))))  # 2's parent goes: 2, 3 are orphans
    v = book.view("receiving")
    assert [(c.cells, c.partial) for c in v.chains] == [("x", False), ("bp", True), ("o", False), ("bb", True)]
    assert v.tokens == BS + 5 + BS + 2 * BS
    assert "✕ …■▪ ◆ …■■" in panel_text(v)


def test_eviction_marks_fade():
    now = [0.0]
    book = CacheBook("x", clock=lambda: now[0])
    book.apply(decode(ENCODER.encode(EventBatch(0.0, [stored([1, 2], None), removed([2])]))))
    assert [c.cells for c in book.view("receiving").chains] == ["bx"]
    now[0] = EVICTED_MARK_S + 0.1
    assert [c.cells for c in book.view("receiving").chains] == ["b"]


def test_a_big_cache_squeezes_but_every_block_stays_on_screen():
    book = CacheBook("x")
    events = [stored(list(range(i * 100, i * 100 + 40)), None) for i in range(10)]  # 10 chains × 40 blocks
    book.apply(decode(ENCODER.encode(EventBatch(0.0, events))))
    v = book.view("receiving")
    per_cell, rows = layout(v.chains, 40, 4)
    assert per_cell > 1 and len(rows) <= 4
    assert sum(1 for row in rows for letter, _ in row if letter == "b") * per_cell >= v.blocks
    assert f"{per_cell} blocks/cell" in panel_text(v, 40, 4)


def test_endpoint_checks():
    assert check_endpoint("tcp://127.0.0.1:5557") == "tcp://127.0.0.1:5557"
    with pytest.raises(ValueError, match="tcp://127.0.0.1:5557"):
        check_endpoint("tcp://*:5557")
    for bad in ("127.0.0.1:5557", "tcp://127.0.0.1:99999", "tcp://127.0.0.1"):
        with pytest.raises(ValueError, match="expected tcp://HOST:PORT"):
            check_endpoint(bad)


def test_a_thread_error_is_a_status_not_a_traceback(monkeypatch):
    s = KVEventsSubscriber("tcp://127.0.0.1:1")
    monkeypatch.setattr(s, "_loop", lambda: 1 / 0)
    s.start()
    s._thread.join(5)
    assert s.view.status == "failed: ZeroDivisionError: division by zero"


# -- the app ---------------------------------------------------------------------------------------
async def test_attached_app_draws_the_prefix_cache_live(fake, pub):
    app = build_app(["--attach", fake.url, "--kv-events", pub.endpoint, "--max-new-tokens", "10"])
    assert isinstance(app.runner, VllmRunner) and app.runner.kv_events is not None
    _watch(app)
    async with app.run_test(size=(120, 44)) as pilot:
        panel = app.query_one("#prefix", PrefixCacheMap)
        assert panel.display and pub.endpoint in panel.border_title
        pub.wait_subscribed()
        await until(pilot, lambda: app.runner.frame.kv_cache.status.startswith("connected"), what="a connection")
        pub.send(stored([1, 2, 3], None))
        pub.send(stored([4], 3), stored([5], 3))
        await until(pilot, lambda: app.runner.frame.kv_cache.batches == 2, what="the events in a frame")
        assert panel.view == app.runner.frame.kv_cache  # the panel shows exactly the frame's view
        text = panel.render().plain
        assert "5 blocks × 16 · 80 tok" in text and "▣ 1 shared" in text and "■■▣■╎■" in text
        assert "no slot grid, block owners" in app.query_one("#server").render().plain
        pub.raw(b"garbage")
        await until(pilot, lambda: "1 bad messages" in panel.render().plain, what="the bad message counted")


def test_kv_events_flag_errors(fake, monkeypatch, capsys):
    for argv, message in (
        (["--kv-events", "tcp://127.0.0.1:5557"], "applies to --attach"),
        (["--attach", fake.url, "--kv-events", "tcp://*:5557"], "connect to the host"),
    ):
        with pytest.raises(SystemExit) as e:
            build_app(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "zmq", None)  # pyzmq not installed
    monkeypatch.delitem(sys.modules, "tui.runners.kv_subscriber")
    with pytest.raises(SystemExit) as e:
        build_app(["--attach", fake.url, "--kv-events", "tcp://127.0.0.1:5557"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "pip install 'tinyllm[vllm-events]'" in err and len(err.strip().splitlines()) == 1


# -- a real vLLM server ----------------------------------------------------------------------------
@pytest.mark.vllm
@pytest.mark.skipif(
    not (os.environ.get("VLLM_URL") and os.environ.get("VLLM_KV_EVENTS")),
    reason="set VLLM_URL and VLLM_KV_EVENTS to a running vLLM server and its events endpoint (README)",
)
async def test_a_real_vllm_servers_prefix_cache():
    """Two prompts with a long common prefix, one after the other: the second hits the first's
    cached blocks (vLLM's prefix_cache_hits counter moves) and its own blocks hang off the last
    shared one, a fork the panel draws as ▣."""
    url, endpoint = os.environ["VLLM_URL"], os.environ["VLLM_KV_EVENTS"]
    runner = VllmRunner(url, poll_s=0.2, kv_events=KVEventsSubscriber(endpoint)).start()
    app = TinyLLMApp(
        runner,
        None,
        model_name=runner.model_name,
        settings=RequestSettings(Sampling(temperature=0.0), 64, stop_at_eos=False),
    )
    _watch(app)
    common = (
        f"[{time.time_ns()}]\n"  # new to the server, run after run
        "KING RICHARD III:\nNow is the winter of our discontent made glorious summer by this sun of York;\n"
        "And all the clouds that lour'd upon our house in the deep bosom of the ocean buried.\n"
        "Now are our brows bound with victorious wreaths; our bruised arms hung up for monuments.\n"
    )
    ids = httpx.post(f"{url}/tokenize", json={"model": runner.model_name, "prompt": common}).json()["tokens"]
    hits = prefix_hits(url)
    async with app.run_test(size=(120, 44)) as pilot:
        await until(pilot, lambda: runner.frame.kv_cache.status != "connecting", what="the events socket")
        await submit(pilot, common + "GLOUCESTER:")
        await until(pilot, lambda: runner.frame.snapshot.requests[0].state == "finished", timeout=120)
        await until(pilot, lambda: runner.frame.kv_cache.blocks > 0, timeout=30, what="BlockStored events")
        size = runner.frame.kv_cache.block_size
        assert size and len(ids) >= 2 * size + 2, "the common prefix must cover two blocks"
        await submit(pilot, common + "CLARENCE:")
        await until(pilot, lambda: runner.frame.snapshot.requests[1].state == "finished", timeout=120)
        await until(pilot, lambda: runner.frame.kv_cache.forks > 0, timeout=30, what="the fork")
        v = runner.frame.kv_cache
        assert v.bad == 0 and v.missed == 0
        chain = next(c for c in v.chains if c.head_tokens and c.head_tokens == tuple(ids[: len(c.head_tokens)]))
        shared = len(ids) // size  # the common prefix's full blocks
        assert chain.cells[:shared] == "b" * (shared - 1) + "s"  # the fork is at its last one
        assert len(chain.cells) >= (len(ids) + 64) // size + 1  # two continuations hang off it
        text = app.query_one("#prefix", PrefixCacheMap).render().plain
        assert f"{v.blocks} blocks × {size}" in text and "▣" in text
    assert prefix_hits(url) - hits >= shared * size  # vLLM counted the hit too


def prefix_hits(url: str) -> float:
    line = next(
        ln for ln in httpx.get(f"{url}/metrics").text.splitlines() if ln.startswith("vllm:prefix_cache_hits_total")
    )
    return float(line.rsplit(" ", 1)[1])
