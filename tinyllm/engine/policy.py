"""The scheduling policy: the order in which waiting requests get a slot.

Both schedulers admit from one waiting queue, and that queue *is* the policy, as in vLLM
(``RequestQueue``, ``--scheduling-policy fcfs|priority``): the schedulers ask it for the next
request and never order anything themselves, and the engine adds, requeues and removes through
it. So a new policy (priority, shortest-first, fair) is one small class with these methods.

Only ``fcfs`` exists today: first come, first served, and a preempted request goes back to the
front (it was admitted before everything still waiting), as vLLM V1 does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Protocol

from tinyllm.engine.sequence import Sequence


class WaitingQueue(Protocol):
    """Requests waiting for a slot, next first. ``len()`` / truth: how many wait."""

    def add(self, seq: Sequence) -> None:
        """A new request joins."""

    def prepend(self, seq: Sequence) -> None:
        """A preempted request comes back (to be recomputed)."""

    def peek(self) -> Sequence:
        """The request to admit next (the queue is not empty)."""

    def pop(self) -> Sequence:
        """Take the request to admit next."""

    def remove(self, seq: Sequence) -> None:
        """An aborted request leaves."""

    def __contains__(self, seq: object) -> bool: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Sequence]:
        """In admission order (snapshots list the queue so)."""


class FCFSQueue:
    """First come, first served; the preempted go back to the front."""

    name = "fcfs"

    def __init__(self) -> None:
        self._q: deque[Sequence] = deque()

    def add(self, seq: Sequence) -> None:
        self._q.append(seq)

    def prepend(self, seq: Sequence) -> None:
        self._q.appendleft(seq)

    def peek(self) -> Sequence:
        return self._q[0]

    def pop(self) -> Sequence:
        return self._q.popleft()

    def remove(self, seq: Sequence) -> None:
        self._q.remove(seq)

    def __contains__(self, seq: object) -> bool:
        return seq in self._q

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._q)


POLICIES: dict[str, type[WaitingQueue]] = {"fcfs": FCFSQueue}


def waiting_queue(policy: str = "fcfs") -> WaitingQueue:
    """An empty waiting queue that admits in ``policy``'s order."""
    if policy not in POLICIES:
        raise ValueError(f"scheduling policy must be one of {sorted(POLICIES)}, got {policy!r}")
    return POLICIES[policy]()
