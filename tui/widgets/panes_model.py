"""Which request each pane of the panes view shows, from one frame alone (no textual).

A pane is a KV slot: it shows the request holding the slot, and once the slot is freed, the
request that last held it (finished, aborted or failed: dimmed; preempted: waiting to be
recomputed) until another request takes the slot, so the hand-over is on the screen. Slots that
have held nobody get no pane. Everything comes from the frame (the snapshot's slots and the event
log's admissions and releases), never from what was drawn before, so a replay moved back shows
the panes as they were at that step.

A server without slots (vLLM: this app's own requests) gets lanes instead: each request takes the
lowest lane whose request had ended when it arrived (from the requests' own times).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from tinyllm.observe.snapshot import ENDED_STATES, EngineSnapshot, RequestView, SlotView
from tui.runners.interface import Frame

SLOT_EVENTS = frozenset({"admit", "finish", "abort", "preempt", "error"})  # log kinds that name a slot


@dataclass(frozen=True)
class Pane:
    """One pane: ``lane`` (a slot number, or a lane where there are no slots), the request it
    shows (None: an empty pane) and whether that request holds the lane now (``holds``: False
    for one that left it, shown until the lane is taken)."""

    lane: int
    view: RequestView | None
    holds: bool
    slotted: bool = True  # a KV slot (False: a lane of a server without slots)
    prefill: tuple[int, int] | None = None  # (tokens computed, context length) while prefilling
    blocks: int | None = None  # paged: KV blocks the slot holds

    @property
    def rid(self) -> int | None:
        return None if self.view is None else self.view.rid

    @property
    def state(self) -> str:
        """What the title says: running, prefill, preempted, finished, aborted, failed, queued."""
        if self.view is None:
            return "free"
        if self.prefill is not None:
            return "prefill"
        return self.view.state


def panes_of(frame: Frame) -> tuple[Pane, ...]:
    """The frame's panes in a stable order (by slot, or by lane)."""
    snap = frame.snapshot
    if not snap.slots:
        return _lanes(snap)
    last = _last_holders(frame, {sv.slot for sv in snap.slots if sv.free})
    out = []
    for sv in snap.slots:
        if not sv.free:
            out.append(_held(snap, sv))
            continue
        rid = last.get(sv.slot)
        v = snap.request(rid) if rid is not None else None
        if v is not None and v.slot is None:
            out.append(Pane(sv.slot, v, False))
    return tuple(out)


def _held(snap: EngineSnapshot, sv: SlotView) -> Pane:
    v = snap.request(sv.rid)
    prefill = (sv.context_len, sv.context_len + sv.prefill_left) if sv.prefill_left else None
    blocks = len(sv.blocks) if snap.kv.kind == "paged" else None
    return Pane(sv.slot, v, True, prefill=prefill, blocks=blocks)


def _last_holders(frame: Frame, free: set[int]) -> dict[int, int | None]:
    """For each free slot, the request of the newest log entry that names it (its last holder),
    or None where that request has since moved to another slot (a preempted one re-admitted
    elsewhere): a request is shown in one pane only, the one it was in last."""
    found: dict[int, int | None] = {}
    if not free:
        return found
    placed = {sv.rid for sv in frame.snapshot.slots if sv.rid is not None}
    for e in reversed(frame.log):
        if e.slot is None or e.rid is None or e.kind not in SLOT_EVENTS:
            continue
        if e.slot in free and e.slot not in found:
            found[e.slot] = None if e.rid in placed else e.rid
            if len(found) == len(free):
                break
        placed.add(e.rid)  # older entries of this request name slots it has left
    return found


def _lanes(snap: EngineSnapshot) -> tuple[Pane, ...]:
    """Lanes for requests without slots: in arrival (id) order, each takes the lowest lane whose
    request had ended by its arrival; a lane shows its newest request."""
    holders: list[RequestView] = []
    ends: list[tuple[float, int]] = []  # (end time, lane) of lanes whose request has ended
    free: list[int] = []  # lanes free at the arrival being placed
    for v in snap.requests:  # (by id: arrival order)
        while ends and ends[0][0] <= v.arrival_s:
            heapq.heappush(free, heapq.heappop(ends)[1])
        lane = heapq.heappop(free) if free else len(holders)
        if lane == len(holders):
            holders.append(v)
        else:
            holders[lane] = v
        if v.state in ENDED_STATES:
            heapq.heappush(ends, (v.finish_s if v.finish_s is not None else v.arrival_s, lane))
    return tuple(Pane(i, v, v.state not in ENDED_STATES, slotted=False) for i, v in enumerate(holders))
