"""A recording as a Chrome trace (JSON), for Perfetto (ui.perfetto.dev) and chrome://tracing,
and as a table of its requests (``request_rows``, ``request_table``: what ``tinyllm trace`` prints).

    process "requests": a track per request (tid = request id + 1, named "#id"), with spans
                        queued / prefill / decode / preempted (args: why it waited, per reason and
                        steps; with an SLO, the request's verdict: slo, slo_outcome, slo_missed,
                        slo_reason) and instants at preemptions, aborts, each change of waiting
                        reason and an SLO missed ("SLO missed: ttft (pool)", when it ended)
    process "slots":    a track per KV slot, a span per request holding it
    process "engine":   counters: KV tokens used / allocated / in free cached blocks, requests
                        running / waiting

Timestamps are the engine clock in whole microseconds, so spans on one track never overlap
(each starts where the previous one ended). The spans come from ``tinyllm.observe.timeline``: the same
tracks the app's timeline panel draws.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from tinyllm.observe.recording import SnapshotDecoder, decode_event, recorded_verdicts
from tinyllm.observe.snapshot import ENDED_STATES, LifecycleEvent
from tinyllm.observe.timeline import build_tracks
from tinyllm.slo import SLO, SLOSummary, SLOVerdict

PID_REQUESTS, PID_SLOTS, PID_ENGINE = 1, 2, 3


def _counter(name: str, ts: int, args: dict) -> dict:
    """A Perfetto counter track's sample on the engine's track (``ph: C``): one series per arg."""
    return {"ph": "C", "pid": PID_ENGINE, "tid": 0, "name": name, "ts": ts, "args": args}


def _us(t: float) -> int:
    return round(t * 1e6)


def _meta(pid: int, tid: int | None, name: str, value: str, sort: int | None = None) -> list[dict]:
    ev = {"ph": "M", "pid": pid, "name": name, "args": {"name": value}}
    if tid is not None:
        ev["tid"] = tid
    out = [ev]
    if sort is not None:
        key = "thread_sort_index" if tid is not None else "process_sort_index"
        out.append(
            {
                "ph": "M",
                "pid": pid,
                **({"tid": tid} if tid is not None else {}),
                "name": key,
                "args": {"sort_index": sort},
            }
        )
    return out


def _span(pid: int, tid: int, name: str, start_s: float, end_s: float, args: dict | None = None) -> dict:
    ts = _us(start_s)
    return {
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "name": name,
        "cat": name,
        "ts": ts,
        "dur": max(0, _us(end_s) - ts),
        "args": args or {},
    }


def perfetto_trace(header: dict, records: list[dict]) -> dict:
    """The Chrome trace event JSON object for a recording (header + records in order)."""
    dec = SnapshotDecoder(header)
    events: list[LifecycleEvent] = []
    counters: list[dict] = []
    last_kv = last_q = last_spec = None
    end_s = 0.0
    for rec in records:
        snap = dec.apply(rec["snap"]) if "snap" in rec else dec.snapshot
        events += [decode_event(row) for row in rec.get("life", ())]
        end_s = max(end_s, snap.time_s)
        kv = snap.kv
        cur_kv = (kv.used_tokens, kv.allocated_tokens, kv.cached_free_blocks * (kv.block_size or 0))
        cur_q = (snap.num_requests_running, snap.num_requests_waiting)
        ts = _us(snap.time_s)
        if cur_kv != last_kv:
            counters.append(
                _counter("KV cache (tokens)", ts, {"used": cur_kv[0], "allocated": cur_kv[1], "cached free": cur_kv[2]})
            )
            last_kv = cur_kv
        if cur_q != last_q:
            counters.append(_counter("requests", ts, {"running": cur_q[0], "waiting": cur_q[1]}))
            last_q = cur_q
        c = snap.counters
        cur_spec = (c.spec_draft_tokens, c.spec_accepted_tokens)
        if c.spec_draft_tokens and cur_spec != last_spec:  # speculation ran: its drafts, cumulative
            counters.append(_counter("speculative draft tokens", ts, {"drafted": cur_spec[0], "kept": cur_spec[1]}))
            last_spec = cur_spec
    if events:
        end_s = max(end_s, max(e.time_s for e in events))
    last_step = max((e.step for e in events), default=0)

    out = (
        _meta(PID_REQUESTS, None, "process_name", "requests", 1)
        + _meta(PID_SLOTS, None, "process_name", "slots", 2)
        + _meta(PID_ENGINE, None, "process_name", "engine", 3)
    )
    verdicts = recorded_verdicts(records)
    for t in build_tracks(events):
        tid = t.rid + 1
        out += _meta(PID_REQUESTS, tid, "thread_name", f"#{t.rid}", t.rid)
        waits = t.wait_spans(last_step)
        judged = verdicts.get(t.rid)
        verdict_args = slo_args(*judged) if judged else {}
        for sp in t.spans:
            args = {"steps": f"{sp.start_step}..{sp.end_step if sp.end_step is not None else '…'}"}
            why = [
                f"{code} (steps {a}..{b})"
                for a, b, code in waits
                if a <= (sp.end_step if sp.end_step is not None else last_step) and b >= sp.start_step
            ]
            if why:
                args["waiting"] = ", ".join(why)  # the scheduler's reasons (WAIT_REASONS)
            args.update(verdict_args)
            out.append(
                _span(PID_REQUESTS, tid, sp.phase, sp.start_s, sp.end_s if sp.end_s is not None else end_s, args)
            )
        if judged and judged[0].outcome == "missed":
            verdict = judged[0]
            out.append(
                {
                    "ph": "i",
                    "pid": PID_REQUESTS,
                    "tid": tid,
                    "name": missed_name(verdict),
                    "s": "t",
                    "ts": _us(t.end_s if t.end_s is not None else end_s),
                    "args": verdict_args,
                }
            )
    for e in events:
        if e.kind in ("preempted", "aborted", "failed", "waiting") and (e.kind != "waiting" or e.reason):
            out.append(
                {
                    "ph": "i",
                    "pid": PID_REQUESTS,
                    "tid": e.rid + 1,
                    "name": e.kind,
                    "s": "t",
                    "ts": _us(e.time_s),
                    "args": {"step": e.step, "slot": e.slot, "reason": e.reason, "tokens": e.tokens},
                }
            )
    out += _slot_spans(header, events, end_s)
    out += counters
    return {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "otherData": {
            "model": header.get("model"),
            "recorded": header.get("created"),
            "settings": header.get("settings"),
            "slo": header.get("slo"),  # the run's --slo (a request's own is in its spans' args)
        },
    }


def slo_line(header: dict, records: list[dict]) -> str:
    """What ``tinyllm trace`` says of the recorded verdicts: ``SLO ttft=500ms: 3/4 met (75%)``
    ("" for a run without an SLO, or a recording made before verdicts were recorded)."""
    verdicts = [v for v, _ in recorded_verdicts(records).values()]
    if not verdicts:
        return ""
    s = SLOSummary.of(verdicts, 0.0)
    share = "" if s.share_met is None else f" ({s.share_met:.0%})"
    apart = "".join(f", {n} {o}" for o, n in (("aborted", s.aborted), ("failed", s.failed)) if n)
    target = header.get("slo") or "each line's own"
    return f"SLO {target}: {s.met}/{s.judged} met{share}{apart}"


def slo_args(verdict: SLOVerdict, slo: SLO) -> dict:
    """A request's verdict as span args: the SLO, the outcome, and for a miss what and why."""
    args = {"slo": str(slo), "slo_outcome": verdict.outcome}
    if verdict.missed:
        args["slo_missed"] = "+".join(verdict.missed)
    if verdict.reason:
        args["slo_reason"] = verdict.reason  # the WAIT_REASONS code it waited most
    return args


def missed_name(verdict: SLOVerdict) -> str:
    """The instant event's name: ``SLO missed: ttft (pool)``."""
    why = f" ({verdict.reason})" if verdict.reason else ""
    return f"SLO missed: {'+'.join(verdict.missed)}{why}"


def _slot_spans(header: dict, events: list[LifecycleEvent], end_s: float) -> list[dict]:
    """A span per request holding a slot: from its admission to the event that freed the slot."""
    out: list[dict] = []
    for s in range(header["engine"]["n_slots"]):
        out += _meta(PID_SLOTS, s + 1, "thread_name", f"slot {s}", s)
    holder: dict[int, tuple[int, float, int]] = {}  # slot → (rid, since, step)
    for e in events:
        if e.slot is None:
            continue
        if e.kind == "admitted":
            holder[e.slot] = (e.rid, e.time_s, e.step)
        elif e.kind in ("preempted", "finished", "aborted", "failed") and holder.get(e.slot, (None,))[0] == e.rid:
            rid, since, step = holder.pop(e.slot)
            out.append(
                _span(
                    PID_SLOTS, e.slot + 1, f"#{rid}", since, e.time_s, {"steps": f"{step}..{e.step}", "freed": e.kind}
                )
            )
    for slot, (rid, since, step) in holder.items():
        out.append(_span(PID_SLOTS, slot + 1, f"#{rid}", since, end_s, {"steps": f"{step}..", "freed": "—"}))
    return out


# -- per request, as a table (``tinyllm trace FILE``) ----------------------------------------------
WAIT_SHORT = {"queue": "queue", "slots": "slots", "pool": "KV", "budget": "budget", "preempted": "recompute"}
TABLE_COLUMNS = ("#", "prompt", "tokens", "TTFT", "end-to-end", "preempted", "ended", "waited (steps)")


@dataclass(frozen=True)
class RequestRow:
    """One request of a recording, as it stood at the recording's end."""

    rid: int
    prompt_tokens: int
    tokens: int
    max_new_tokens: int
    ttft_s: float | None
    e2e_s: float | None  # arrival to its end (finished, aborted or failed); None while it ran on
    preemptions: int
    ended: str  # "finished (length)", "aborted at step 30", "running at the end", ...
    waited: tuple[tuple[str, int], ...] | None  # (WAIT_REASONS code, steps), most first; None: the
    # recording has no wait reasons (made before they were recorded)
    slo: str = ""  # its verdict's mark against its SLO (✓, ✗ ttft (pool), aborted); "" without one


def request_rows(header: dict, records: list[dict]) -> list[RequestRow]:
    """Each request of a recording: its TTFT, end-to-end, tokens, preemptions, how it ended and
    the steps it waited for each reason (the scheduler's, as the timeline draws them)."""
    dec = SnapshotDecoder(header)
    events: list[LifecycleEvent] = []
    for rec in records:
        if "snap" in rec:
            dec.apply(rec["snap"])
        events += [decode_event(row) for row in rec.get("life", ())]
    snap = dec.snapshot
    last_step = max([snap.counters.steps] + [e.step for e in events])
    tracks = {t.rid: t for t in build_tracks(events)}
    # Each request's "wait" field is in recordings made since wait reasons were recorded: an
    # older one's table says "?" (unknown), not "—" (never waited).
    fields = (r for rec in records for r in (rec.get("snap") or {}).get("r", {}).values())
    waits_recorded = any(e.kind == "waiting" for e in events) or any(
        isinstance(r, dict) and "wait" in r for r in fields
    )
    ends = {e.rid: e for e in events if e.kind in ENDED_STATES}  # (an ending event is named as the state)
    verdicts = recorded_verdicts(records)
    rows = []
    for v in sorted(snap.requests, key=lambda v: v.rid):
        track = tracks.get(v.rid)
        waited: dict[str, int] = {}
        for a, b, code in track.wait_spans(last_step) if track is not None else ():
            waited[code] = waited.get(code, 0) + b - a + 1
        end = ends.get(v.rid)
        if v.state == "finished":
            ended = f"finished ({end.reason})" if end is not None and end.reason else "finished"
        elif v.state in ("aborted", "failed"):
            ended = v.state + (f" at step {end.step}" if end is not None else "")
            if v.state == "failed" and v.error:
                ended += f": {v.error}"
        else:
            ended = f"{v.state} at the end"
        rows.append(
            RequestRow(
                v.rid,
                len(v.prompt),
                len(v.tokens),
                v.max_new_tokens,
                v.ttft_s,
                None if v.finish_s is None else v.finish_s - v.arrival_s,
                v.preemptions,
                ended,
                tuple(sorted(waited.items(), key=lambda kv: (-kv[1], kv[0]))) if waits_recorded else None,
                verdicts[v.rid][0].mark if v.rid in verdicts else "",
            )
        )
    return rows


def request_table(rows: list[RequestRow]) -> str:
    """``request_rows`` as aligned text, one line per request under a header line."""
    from tinyllm.units import duration

    cells = [TABLE_COLUMNS] + [
        (
            str(r.rid),
            str(r.prompt_tokens),
            f"{r.tokens}/{r.max_new_tokens}",
            duration(r.ttft_s),
            duration(r.e2e_s),
            f"{r.preemptions}×" if r.preemptions else "0",
            r.ended,
            "?" if r.waited is None else ", ".join(f"{WAIT_SHORT.get(code, code)} {n}" for code, n in r.waited) or "—",
        )
        for r in rows
    ]
    if any(r.slo for r in rows):  # a run with an SLO: each request's verdict, after how it ended
        cells = [(*row[:7], head or "—", *row[7:]) for row, head in zip(cells, ["SLO"] + [r.slo for r in rows])]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    right = {0, 1, 2, 3, 4, 5}  # figures right-aligned; how it ended and why it waited read left to right
    lines = []
    for row in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(parts).rstrip())
    note = (
        "waited: the steps it computed nothing, by the scheduler's reason (queue: behind earlier requests; "
        "slots: no free slot; KV: the pool full; budget: the step's token budget used up; recompute: preempted)"
    )
    if any(r.waited is None for r in rows):
        note += "; ? = this recording has no reasons (made before they were recorded)"
    if any(r.slo for r in rows):
        note += (
            "; SLO: ✓ met, ✗ the targets missed (the reason it waited most), — not judged (no SLO, or it had not ended)"
        )
    lines += textwrap.wrap(note, 100)
    return "\n".join(lines)
