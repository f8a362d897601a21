"""A submitted request as its HTTP handler sees it (``RequestHandle``): the messages the engine
thread posts to the handle's asyncio queue, and the ``Output`` a handler reads from it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from tinyllm.observe.accounting import Accounting, RequestTimes
from tinyllm.request import Request, TokenLogprob


class RequestRejected(Exception):
    """The engine refused a request at submission (it can never run: too long, bad token id)."""

    def __init__(self, message: str, context_too_long: bool = False):
        super().__init__(message)
        self.context_too_long = context_too_long


class RequestFailed(Exception):
    """A request ended without finishing: the engine failed it, or the server is stopping."""


class Owner(Protocol):
    """The engine loop, as a handle reaches it (``EngineLoop``)."""

    def abort(self, handle: RequestHandle) -> None: ...

    def finish(self, handle: RequestHandle, keep: int) -> None: ...


# -- messages from the engine thread to a handle's asyncio queue ------------------------------
@dataclass(frozen=True)
class Accepted:
    """The engine queued the request under this id (an abort names it from now on)."""

    rid: int


@dataclass(frozen=True)
class Rejected:
    """The engine refused the request at submission (the handle raises RequestRejected)."""

    message: str
    context_too_long: bool


@dataclass(frozen=True)
class Token:
    """One token the request produced in a step."""

    token: int
    finish_reason: str | None  # "stop" (EOS) / "length" (max_new_tokens) on the last token
    cached_tokens: int
    accounting: Accounting | None = None  # on the last token: where the request's time went
    logprob: TokenLogprob | None = None  # only for a request that asked for logprobs


@dataclass(frozen=True)
class End:
    """The request ended without a token of its own: its handler matched a stop string."""

    finish_reason: str
    cached_tokens: int
    accounting: Accounting | None = None


@dataclass(frozen=True)
class Failed:
    """The engine failed the request mid-run (its other requests go on)."""

    message: str


@dataclass(frozen=True)
class Output:
    """What a request produced since the handler last asked (one or more steps' tokens)."""

    tokens: tuple[int, ...]
    finish_reason: str | None = None  # set on the request's last output
    cached_tokens: int = 0  # prompt tokens the prefix cache served (at its first admission)
    accounting: Accounting | None = None  # set on the request's last output
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token, for a request that asked for logprobs

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(eq=False)
class RequestHandle:
    """One submitted request, as its HTTP handler sees it. Read it from the event loop that
    submitted it (``accepted()``, ``next_output()``); ``close()`` aborts it if unfinished."""

    request: Request
    owner: Owner
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    rid: int | None = None
    ended: bool = False  # event-loop side: finished, failed, rejected or closed
    _cached_tokens: int = 0  # engine-thread side: the first admission's prefix-cache hit
    _times: RequestTimes = field(default_factory=RequestTimes)  # engine-thread side: its phase boundaries
    _stopping: bool = False  # engine-thread side: finished by its handler (a stop string)
    stops: tuple[str, ...] = ()  # its stop strings (its handler matches them; viewers apply them too)

    async def accepted(self) -> int:
        """Wait until the engine queued the request; its id. Raises RequestRejected."""
        msg = await self.queue.get()
        if isinstance(msg, Rejected):
            self.ended = True
            raise RequestRejected(msg.message, msg.context_too_long)
        if isinstance(msg, Failed):
            self.ended = True
            raise RequestFailed(msg.message)
        assert isinstance(msg, Accepted), msg
        self.rid = msg.rid
        return msg.rid

    async def next_output(self) -> Output:
        """Wait for new tokens, then take every token already delivered (a slow reader gets
        several at once). Raises RequestFailed if the request ended without finishing."""
        items = [await self.queue.get()]
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        toks, reason, cached, acc, lps = [], None, 0, None, []
        for m in items:
            if isinstance(m, Failed):
                self.ended = True
                raise RequestFailed(m.message)
            if isinstance(m, Token):
                toks.append(m.token)
                if m.logprob is not None:
                    lps.append(m.logprob)
            reason, cached, acc = m.finish_reason, m.cached_tokens, m.accounting
        if reason is not None:
            self.ended = True
        return Output(tuple(toks), reason, cached, acc, tuple(lps))

    def finish(self, keep: int) -> None:
        """End the request now, keeping its first ``keep`` tokens: its handler matched a stop
        string (tinyllm.stops). Keep reading ``next_output()``: its last output says "stop"."""
        if not self.ended:
            self.owner.finish(self, keep)

    def close(self) -> None:
        """Abort the request unless it already ended (the client went away). Idempotent."""
        if not self.ended:
            self.ended = True
            self.owner.abort(self)


def deliver(items: list[tuple[RequestHandle, object]]) -> None:
    """Put the engine thread's messages on their handles' queues (run in each handle's event loop)."""
    for h, msg in items:
        h.queue.put_nowait(msg)
