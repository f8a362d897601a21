"""Connection hygiene, without a proxy in front: connections that never send a request are cut.

uvicorn times out a keep-alive connection after its response, but nothing before the first
request, and any byte resets that timer: 1,030 TCP connections that sent nothing made every
request a 503 (uvicorn's ``limit_concurrency`` counts connections), ``/health`` included, and
were still open 30 s later. So every connection here is *idle* until a request's headers are in
and again once its response is out, and an idle connection:

- must bring a whole request's headers within ``header_timeout_s`` (a byte now and then does not
  reset it: slow-header clients are cut, not served forever);
- counts toward its client's (its IP's) cap, ``idle_per_client``: a new connection over the cap
  closes that client's oldest idle one, so a client filling the server with silent connections
  only ever loses its own, and a new request (a probe's ``/health``) always gets in.

A connection with a request in flight is never cut here (its body has ``read_body``'s own
deadline, a stream runs as long as it runs). The h11 protocol is uvicorn's, subclassed.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0  # a connection's request headers must be in within this
IDLE_PER_CLIENT = 128  # connections one IP may hold without a request in flight


def guarded_protocol(header_timeout_s: float = HEADER_TIMEOUT_S, idle_per_client: int = IDLE_PER_CLIENT) -> type:
    """An H11Protocol class for one server (its own table of idle connections per client)."""
    idle: dict[str, OrderedDict[int, GuardedH11Protocol]] = {}

    class GuardedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _who = ""

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._who = self.client[0] if self.client else ""
            self._now_idle()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._now_busy()  # a request's headers are in

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self._now_idle()  # (a pipelined request may have started already)

        def connection_lost(self, exc: Exception | None) -> None:
            self._now_busy()
            if not idle.get(self._who):
                idle.pop(self._who, None)  # (a client's table lives while it has idle connections)
            super().connection_lost(exc)

        def _now_idle(self) -> None:
            mine = idle.setdefault(self._who, OrderedDict())
            if id(self) in mine:
                return
            mine[id(self)] = self
            while len(mine) > idle_per_client:
                _, oldest = mine.popitem(last=False)
                oldest._cut()
            self._deadline = self.loop.call_later(header_timeout_s, self._cut)

        def _now_busy(self) -> None:
            mine = idle.get(self._who)
            if mine is not None:
                mine.pop(id(self), None)
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _cut(self) -> None:
            self._now_busy()
            if not self.transport.is_closing():
                self.transport.close()

    return GuardedH11Protocol
