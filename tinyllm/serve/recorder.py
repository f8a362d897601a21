"""``tinyllm serve --record FILE``: the server's own recording of the traffic it really saw, for
``tinyllm tune`` / ``tinyllm whatif`` / ``tinyllm-tui --replay``.

The file holds what ``GET /v1/tinyllm/stream`` sends (one more viewer of the StateFeed, drained
in the event loop, never on the engine thread), plus each ended request's SLO verdict with
``--slo`` (tinyllm/observe/verdicts.py, the app recorder's judge). By default the requests' text
stays out: no prompt or generated text, and every token id in the snapshots goes through a
random permutation of the vocabulary drawn for this recording and never stored, so lengths,
arrivals and shared prefixes (what scheduling depends on) survive and the text cannot be read
back. The header's ``"text": false`` says so. ``--record-text`` keeps the text, as the stream.
"""

from __future__ import annotations

import asyncio
import random
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tinyllm.observe.recording import RecordingWriter, SnapshotEncoder
from tinyllm.observe.snapshot import EngineSnapshot, RequestView
from tinyllm.observe.verdicts import VerdictJudge
from tinyllm.serve.engine_loop import EngineLoop
from tinyllm.serve.stream import HEARTBEAT_S, StateFeed, viewer_record
from tinyllm.slo import SLO


@dataclass(frozen=True)
class RecordTo:
    """--record FILE (and --record-text: keep the requests' text)."""

    path: Path
    text: bool = False


class TokenMask:
    """Token ids mapped through a random permutation of the vocabulary (kept in memory only):
    equal ids stay equal, so prompt lengths and shared prefixes survive, the text does not."""

    def __init__(self, vocab_size: int, rng: random.Random | None = None):
        perm = list(range(vocab_size))
        (rng or random.SystemRandom()).shuffle(perm)
        self._perm = perm
        self._done: dict[int, tuple[RequestView, RequestView]] = {}  # rid -> (its view, masked)

    def ids(self, tokens: tuple[int, ...]) -> tuple[int, ...]:
        p, n = self._perm, len(self._perm)
        return tuple(p[t] if 0 <= t < n else t for t in tokens)

    def view(self, v: RequestView) -> RequestView:
        """``v`` with its prompt and tokens masked. The engine reuses a view until it changes:
        so is its masked one (the encoder's ``is`` test then skips it), and a request's tokens
        only grow, so a step masks its new tokens, not the whole context."""
        done = self._done.get(v.rid)
        if done is not None and done[0] is v:
            return done[1]
        was, old = done if done is not None else (None, None)
        if was is None or old is None or (v.prompt is not was.prompt and v.prompt != was.prompt):
            prompt, tokens = self.ids(v.prompt), self.ids(v.tokens)
        elif v.tokens[: len(was.tokens)] != was.tokens:  # (not appended to: masked again)
            prompt, tokens = old.prompt, self.ids(v.tokens)
        else:
            prompt, tokens = old.prompt, old.tokens + self.ids(v.tokens[len(was.tokens) :])
        out = replace(v, prompt=prompt, tokens=tokens)
        self._done[v.rid] = (v, out)
        return out

    def snapshot(self, snap: EngineSnapshot) -> EngineSnapshot:
        live = {v.rid for v in snap.requests}
        for rid in [r for r in self._done if r not in live]:  # forgotten by the engine
            del self._done[rid]
        return replace(snap, requests=tuple(self.view(v) for v in snap.requests))


class ServerRecorder:
    """One StateFeed viewer written to a file: ``await start()`` once the engine loop runs,
    ``await close()`` once it has stopped (the last record holds the requests its stop ended)."""

    def __init__(self, to: RecordTo, feed: StateFeed, engine_loop: EngineLoop, vocab_size: int, slo: SLO | None):
        self.to, self.feed, self.engine_loop = to, feed, engine_loop
        self.mask = None if to.text else TokenMask(vocab_size)
        self.judge = VerdictJudge(slo) if slo is not None else None
        self.slo = slo
        self._viewer: Any = None
        self._task: asyncio.Task | None = None
        self.writer: RecordingWriter | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._viewer, header = await self.engine_loop.call_async(lambda eng: self.feed.subscribe(eng, loop))
        header = dict(header, text=self.to.text)
        if self.slo is not None:
            header["slo"] = str(self.slo)
        self.writer = RecordingWriter(self.to.path, header)
        self._task = asyncio.create_task(self._drain(SnapshotEncoder(header)))

    async def _drain(self, encoder: SnapshotEncoder) -> None:
        v, writer = self._viewer, self.writer
        assert writer is not None
        try:
            while True:
                closing = v.closing or not self.engine_loop.thread.is_alive()
                snap, events, text, prompt = self.feed.take(v)
                if not self.to.text:
                    text, prompt = {}, {}
                rec = viewer_record(v, encoder, self.mask.snapshot(snap) if self.mask else snap, events, text, prompt)
                if self.judge is not None and events:
                    verdicts = self.judge.judge(snap, events)
                    if verdicts:
                        rec["verdict"] = verdicts
                if len(rec) > 1:  # (not a heartbeat)
                    writer.write(rec)
                if closing:
                    return
                if v.dropped:
                    print(
                        f"tinyllm serve: --record {self.to.path}: fell behind the engine; recording stopped",
                        file=sys.stderr,
                    )
                    return
                try:
                    await asyncio.wait_for(v.wake.wait(), HEARTBEAT_S)
                except TimeoutError:
                    writer.flush()  # idle: what is written is on disk
        finally:
            self.feed.unsubscribe(v)
            writer.close()

    async def close(self) -> None:
        """Write what is pending, then close the file (any time after start)."""
        if self._task is None:
            return
        self._viewer.closing = True
        self._viewer.wake.set()
        await self._task
        self._task = None
