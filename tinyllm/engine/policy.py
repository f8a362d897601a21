"""Scheduling policies: who waits for a slot in which order, and whom to preempt.

Both schedulers admit from one waiting queue, and that queue *is* the policy, as in vLLM
(``RequestQueue``, ``--scheduling-policy fcfs|priority``): the schedulers ask it for the next
request, which running request to preempt when the pool runs short (``victim``), whether a
waiting request may push a running one out (``outranks``), and tell it who got how many tokens
(``charge``). They never order anything themselves, so a policy is one small class:

- ``fcfs``: first come, first served; a preempted request goes back to the front (it was
  admitted before everything still waiting), the newest running request is preempted first
  (vLLM V1's default).
- ``priority``: lower ``priority`` first, ties by arrival (vLLM's semantics and name); a waiting
  request may preempt a running one of strictly lower priority (a larger number), and the
  lowest-priority running request (latest arrival among equals) is the one preempted.
- ``shortest-first``: the smallest job first, a job being prompt + max_new_tokens (known up
  front), ties by arrival. Long requests can wait as long as short ones keep coming.
- ``fair``: the token budget shared between tenants (a request's ``tenant``: a request field or
  the HTTP API key). Each tenant has a counter of the tokens computed for it (prefill and decode,
  as the scheduler charges them); the next admission goes to the waiting tenant with the
  smallest counter; the scheduler charges tokens as it plans them, so one step's admissions
  alternate too. A tenant that starts waiting has its counter lifted to the smallest counter of
  the tenants already waiting (nobody waiting: the largest counter), so idle time is not saved up
  as credit (Sheng et al., "Fairness
  in Serving Large Language Models", OSDI 2024: the Virtual Token Counter). Bound, tested: while
  two tenants both wait, their counters never differ by more than one request's worth of tokens
  per slot (n_slots × the largest prompt + max_new_tokens) plus one step's token budget.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol

from tinyllm.engine.sequence import Sequence
from tinyllm.request import SCHEDULING_POLICIES


class WaitingQueue(Protocol):
    """Requests waiting for a slot, next first. ``len()`` / truth: how many wait."""

    name: str

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

    def victim(self, running: list[Sequence]) -> Sequence:
        """Which of ``running`` (non-empty, in admission order) to preempt when the pool is short."""

    def outranks(self, seq: Sequence, running: Sequence) -> bool:
        """May waiting ``seq`` preempt ``running`` to get in? (Only ``priority`` ever says yes.)"""

    def charge(self, seq: Sequence, tokens: int) -> None:
        """``seq`` computes ``tokens`` tokens this step, as the scheduler plans them (the fair
        policy counts them, so the next pick of the same step sees them)."""

    def running_order(self, running: list[Sequence]) -> list[Sequence]:
        """``running``, the one to keep most first: decodes are planned in this order, so the
        pool running short preempts one planned later (``victim``), never a more important one."""

    def __contains__(self, seq: object) -> bool: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Sequence]:
        """In admission order (snapshots list the queue so; the pane says "behind N")."""


class FCFSQueue:
    """First come, first served; the preempted go back to the front; the newest is preempted."""

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

    def victim(self, running: list[Sequence]) -> Sequence:
        return running[-1]

    def running_order(self, running: list[Sequence]) -> list[Sequence]:
        return list(running)  # admission order: the newest goes first

    def outranks(self, seq: Sequence, running: Sequence) -> bool:
        return False

    def charge(self, seq: Sequence, tokens: int) -> None:
        pass

    def __contains__(self, seq: object) -> bool:
        return seq in self._q

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._q)


class SortedQueue(FCFSQueue):
    """Kept sorted by ``key`` (smallest first); a preempted request goes back to its key's place.
    Its queue is a list (FCFSQueue's is a deque): ``in``, ``len``, ``iter`` and ``remove`` work alike."""

    key: Callable[[Sequence], tuple]

    def __init__(self) -> None:
        self._q: list[Sequence] = []  # type: ignore[assignment]

    def add(self, seq: Sequence) -> None:
        bisect.insort(self._q, seq, key=self.key)

    prepend = add

    def pop(self) -> Sequence:
        return self._q.pop(0)


class PriorityQueue(SortedQueue):
    """Lower ``priority`` first, ties by arrival; may preempt strictly lower priority."""

    name = "priority"

    @staticmethod
    def key(seq: Sequence) -> tuple:
        return seq.req.priority, seq.arrival, seq.rid

    def victim(self, running: list[Sequence]) -> Sequence:
        return max(running, key=self.key)

    def running_order(self, running: list[Sequence]) -> list[Sequence]:
        return sorted(running, key=self.key)

    def outranks(self, seq: Sequence, running: Sequence) -> bool:
        return seq.req.priority < running.req.priority


class ShortestFirstQueue(SortedQueue):
    """Smallest prompt + max_new_tokens first, ties by arrival."""

    name = "shortest-first"

    @staticmethod
    def key(seq: Sequence) -> tuple:
        return len(seq.req.prompt) + seq.req.max_new_tokens, seq.arrival, seq.rid


class FairQueue(FCFSQueue):
    """The waiting tenant with the fewest tokens computed goes next (see the module docstring)."""

    name = "fair"

    REMEMBERED = 4096  # tenants whose account is kept while they wait for nothing (then the least served go)

    def __init__(self) -> None:
        self._by_tenant: dict[str, deque[Sequence]] = {}
        self.served: dict[str, int] = {}  # tenant -> tokens computed for it (lifted)

    def _next_tenant(self, served: dict[str, int]) -> str:
        return min(self._by_tenant, key=lambda t: (served[t], self._by_tenant[t][0].arrival, self._by_tenant[t][0].rid))

    def _join(self, seq: Sequence, front: bool) -> None:
        t = seq.req.tenant
        if t not in self._by_tenant:  # starts waiting: no credit for idle time
            waiting = [self.served[w] for w in self._by_tenant]
            # level with the least served of those waiting; with nobody waiting, with the most
            # served (the others ran meanwhile: idle time is not saved up)
            floor = min(waiting) if waiting else max(self.served.values(), default=0)
            self.served[t] = max(self.served.get(t, 0), floor)
            self._by_tenant[t] = deque()
            if len(self.served) > self.REMEMBERED:
                self._forget()
        (self._by_tenant[t].appendleft if front else self._by_tenant[t].append)(seq)

    def _forget(self) -> None:
        """Drop the accounts of half the tenants not waiting, the least served first: a client's
        ``user`` field names a tenant, and one account per name kept forever made each admission
        scan them all (9 ms at 100k tenants). A forgotten tenant that comes back is levelled up
        to those waiting, as a new one is, so only a tenant served far more than others could
        gain, and the most served are the ones kept."""
        idle = sorted((n, t) for t, n in self.served.items() if t not in self._by_tenant)
        for _, t in idle[: max(len(self.served) - self.REMEMBERED // 2, 0)]:
            del self.served[t]

    def add(self, seq: Sequence) -> None:
        self._join(seq, front=False)

    def prepend(self, seq: Sequence) -> None:
        self._join(seq, front=True)

    def peek(self) -> Sequence:
        return self._by_tenant[self._next_tenant(self.served)][0]

    def pop(self) -> Sequence:
        return self._take(self._next_tenant(self.served))

    def _take(self, tenant: str) -> Sequence:
        q = self._by_tenant[tenant]
        seq = q.popleft()
        if not q:
            del self._by_tenant[tenant]
        return seq

    def remove(self, seq: Sequence) -> None:
        q = self._by_tenant[seq.req.tenant]
        q.remove(seq)
        if not q:
            del self._by_tenant[seq.req.tenant]

    def charge(self, seq: Sequence, tokens: int) -> None:
        t = seq.req.tenant
        self.served[t] = self.served.get(t, 0) + tokens

    def __contains__(self, seq: object) -> bool:
        return isinstance(seq, Sequence) and seq in self._by_tenant.get(seq.req.tenant, ())

    def __len__(self) -> int:
        return sum(len(q) for q in self._by_tenant.values())

    def __iter__(self) -> Iterator[Sequence]:
        """The order the queue would admit in if nothing else were charged meanwhile (each
        admission charged its whole job), so "behind N" is a fair estimate."""
        served = dict(self.served)
        queues = {t: deque(q) for t, q in self._by_tenant.items()}
        while queues:
            t = min(queues, key=lambda t: (served[t], queues[t][0].arrival, queues[t][0].rid))
            seq = queues[t].popleft()
            if not queues[t]:
                del queues[t]
            served[t] += len(seq.req.prompt) + seq.req.max_new_tokens
            yield seq


POLICIES: dict[str, type[FCFSQueue]] = {
    "fcfs": FCFSQueue,
    "priority": PriorityQueue,
    "shortest-first": ShortestFirstQueue,
    "fair": FairQueue,
}
assert tuple(POLICIES) == SCHEDULING_POLICIES  # the names, torch-free, live in request.py


def check_policy(policy) -> str:
    """The policy's name, or ValueError naming the choices."""
    if policy not in POLICIES:
        raise ValueError(f"scheduling policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    return policy


def waiting_queue(policy: str = "fcfs") -> WaitingQueue:
    """An empty waiting queue that admits in ``policy``'s order."""
    return POLICIES[check_policy(policy)]()
