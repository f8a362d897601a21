"""What-if: the same requests, arriving at the same times, under other engine settings, compared
request by request.

The requests come from a recording (``tinyllm-tui --record``, or a server's state stream saved
with ``curl -N``) or a workload file. Each lane is a race lane (``race/spec.py``: a policy, a
budget, a pool size, ...), so the race's fairness rules hold: every lane runs the requests at
their recorded arrival times on its own clock, greedy, every token made. From a recording, a
request that finished asks for the tokens it really made (so each lane does the recorded work);
one still running or waiting when the recording stopped, its max_new_tokens; an aborted or
failed one, the tokens it had (at least 1).

Exact in every lane (no clock involved): tokens, steps, admission order, preemptions, steps
waited per reason. Clock-dependent (this machine's speed, ±noise): every time in ms/s.
No torch here: the comparison is plain data the app and ``tinyllm whatif`` both show.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tinyllm.observe.recording import (
    BAD_RECORD,
    RecordingError,
    SnapshotDecoder,
    header_slo,
    read_recording,
    recorded_slos,
)
from tinyllm.observe.stats import percentile
from tinyllm.race.spec import Recorded
from tinyllm.race.verdicts import Judging, rank
from tinyllm.race.views import LaneView, RequestOutcome
from tinyllm.request import SCHEDULING_POLICIES, Request, kv_dtype_name
from tinyllm.slo import SLO

Arrivals = list[tuple[float, Request]]


def recorded_views(path: str | Path, read: tuple | None = None):
    """Every request a recording saw, its latest view, in arrival order (as every lane numbers
    them), and the reader's warning (a recording cut off mid-write). RecordingError for a file
    that is not a recording, or that holds no requests. ``read``: read_recording(path) already."""
    header, records, warning = read if read is not None else read_recording(path)
    dec = SnapshotDecoder(header)
    views = {}
    for line, rec in records:
        if "snap" in rec:
            try:
                snap = dec.apply(rec["snap"])
            except BAD_RECORD as e:
                raise RecordingError(
                    f"{path}:{line}: not a snapshot delta this version wrote ({type(e).__name__}: {e})"
                ) from None
            for v in snap.requests:
                views[v.rid] = v  # the latest view (forgotten ones kept)
    if not views:  # (quit at once, or a stream cut before any request)
        raise RecordingError(f"{path}: the recording holds no requests: nothing to run again")
    return sorted(views.values(), key=lambda v: (v.arrival_s, v.rid)), warning


def requests_from_recording(path: str | Path) -> tuple[Arrivals, str | None]:
    """Every request a recording saw, as (arrival_s, Request), and the reader's warning (a
    recording cut off mid-write). RecordingError for a file that is not a recording."""
    views, warning = recorded_views(path)
    out = []
    start = min((v.arrival_s for v in views), default=0.0)  # a server's clock may be at 3600 s
    for v in views:
        if v.state == "finished":
            new = len(v.tokens)
        elif v.state in ("aborted", "failed"):
            new = max(1, len(v.tokens))
        else:
            new = v.max_new_tokens
        out.append(
            (round(v.arrival_s - start, 6), Request(list(v.prompt), max(1, new), priority=v.priority, tenant=v.tenant))
        )
    return out, warning


def recorded_settings(source: str | Path) -> Recorded | None:
    """The engine settings a recording ran at, from its header (None: ``source`` is not a
    recording); RecordingError for a header this version cannot read."""
    from tinyllm.observe.recording import check_header, open_text

    path = Path(source).expanduser()
    if not (path.is_file() and is_recording(path)):
        return None
    try:
        with open_text(path, "r") as f:
            header = json.loads(f.readline())
    except (OSError, UnicodeDecodeError, EOFError, ValueError):
        header = None
    check_header(header, f"{path}:1")
    return settings_from_header(header)


def settings_from_header(header: dict) -> Recorded:
    """The header's "engine" part (what the engine resolved: a KV budget's blocks and sequences
    included) as lane settings; its "settings" (the options as given) for what an older header
    lacks; what neither says is ``missing``, with the default a lane then runs at."""
    e, given = header["engine"], header.get("settings") or {}
    k = e["kv"]
    kind = "continuous" if e["max_batched_tokens"] is None else "chunked"
    fields: dict = {"kv": k["kind"], "slots": e["n_slots"]}
    missing = {}
    if k["kind"] == "paged":
        fields.update(block_size=k["block_size"], kv_blocks=k["n_blocks"])
    if kind == "chunked":
        fields["budget"] = e["max_batched_tokens"]
        if "cached_flags" in k or "prefix_cache" in given:  # the app's None: on with chunked prefill
            fields["prefix_cache"] = k.get("cached_flags", given.get("prefix_cache")) is not False
        else:
            missing["prefix_cache"] = ("prefix cache setting", "prefix=on")
    policy = e.get("policy", given.get("scheduling_policy"))
    if policy in SCHEDULING_POLICIES:
        fields["policy"] = policy
    else:
        missing["policy"] = ("scheduling policy", "fcfs")
    dtype = kv_dtype_name(str(k.get("dtype") or given.get("kv_cache_dtype") or "auto"))
    if dtype not in (None, "auto"):
        fields["kv_dtype"] = dtype
    else:
        missing["kv_dtype"] = ("KV cache dtype", "--kv-cache-dtype auto")
    pool = fields["kv_blocks"] * fields["block_size"] if k["kind"] == "paged" else None
    return Recorded(kind, fields, e["max_len"], missing, pool)


def is_recording(path: str | Path) -> bool:
    """Whether ``path`` starts like a tinyllm recording (a header line), not a workload file."""
    from tinyllm.observe.recording import FORMAT, open_text

    try:
        with open_text(Path(path), "r") as f:
            first = f.readline(1 << 16)
    except (OSError, UnicodeDecodeError, EOFError):
        return False
    return f'"format":"{FORMAT}"' in first.replace(" ", "")


def load_arrivals(source: str, encode, max_len: int, new_tokens: int | None = None) -> tuple[Arrivals, str | None]:
    """The requests of a recording or a workload (a file, or a bundled workload's name), as
    (arrival_s, Request); and a warning to show (a recording cut off; ``new_tokens``, what
    --max-new-tokens gave a workload line without max_new_tokens, taken by no request).
    RecordingError / WorkloadError / ContextTooLong say what is wrong."""
    from tinyllm.workload import NEW_TOKENS, load_workload, resolve_workload, samples, tokenize_checked

    asked_new, default_new = new_tokens is not None, new_tokens or NEW_TOKENS
    unused = (
        f"--max-new-tokens {default_new} is unused: every request of {Path(source).name} sets its own "
        f"(it fills only workload lines without max_new_tokens)"
    )
    path = Path(source).expanduser()
    if path.exists() and is_recording(path):
        arrivals, warning = requests_from_recording(path)
        return arrivals, "; ".join(w for w in (warning, unused if asked_new else None) if w) or None
    path = resolve_workload(source)
    items = load_workload(path)
    ids = tokenize_checked(items, path, encode, max_len, default_new)
    takes = any(not it.max_new_tokens for it in items)
    return [
        (it.arrival_s, Request(i, it.max_new_tokens or default_new, priority=it.priority or 0, tenant=it.tenant or ""))
        for it, i in samples(items, ids)
    ], unused if asked_new and not takes else None


@dataclass(frozen=True)
class RequestRow:
    """One request across the lanes; ``change``: the largest end-to-end change against the first
    lane, as a fraction (+ = slower)."""

    rid: int
    prompt_tokens: int
    new_tokens: int
    priority: int
    tenant: str
    arrival_s: float
    outcomes: tuple[RequestOutcome | None, ...]  # per lane, in lane order
    change: float
    ended: str = ""  # "aborted" / "failed": how the recording saw it end (left out of "most changed")


def compare(lanes: tuple[LaneView, ...], judging: Judging | None = None) -> tuple[RequestRow, ...]:
    """Per request, every lane's outcome (the lanes are done); the requests that changed most
    first, those the recording saw aborted or failed (``judging``) last, marked, unranked."""
    judging = judging or Judging()
    by_lane = [{o.rid: o for o in lane.outcomes} for lane in lanes]
    rows = []
    for rid in sorted({rid for m in by_lane for rid in m}):
        outs = tuple(m.get(rid) for m in by_lane)
        base, who = outs[0], next(o for o in outs if o is not None)
        change = max(
            (o.e2e_s / base.e2e_s - 1 for o in outs[1:] if o and base and base.e2e_s > 0), key=abs, default=0.0
        )
        ended = judging.left_out(rid)
        row = RequestRow(
            rid, who.prompt_tokens, who.new_tokens, who.priority, who.tenant, who.arrival_s, outs, change, ended
        )
        rows.append(row)
    return tuple(sorted(rows, key=lambda row: (bool(row.ended), -abs(row.change), row.rid)))


def same_schedule(a: LaneView, b: LaneView) -> bool:
    """Whether two finished lanes made the same decisions on every step: as many steps and
    preemptions, and every request waited as many steps for the same reasons and was preempted as
    often. (Their times may still differ on the wall clock: that is noise, not the schedule.)"""
    if a.result is None or b.result is None or a.result.decode_steps != b.result.decode_steps:
        return False
    if a.result.preemptions != b.result.preemptions or len(a.outcomes) != len(b.outcomes):
        return False
    key = {o.rid: (o.preemptions, o.waited, o.new_tokens) for o in a.outcomes}
    return all(key.get(o.rid) == (o.preemptions, o.waited, o.new_tokens) for o in b.outcomes)


def group_of(row: RequestRow, by: str) -> str:
    return row.tenant or "(none)" if by == "tenant" else f"priority {row.priority}"


def grouping(rows: tuple[RequestRow, ...]) -> str | None:
    """What the requests differ by: "tenant", "priority", or None (one group)."""
    if len({r.tenant for r in rows}) > 1:
        return "tenant"
    if len({r.priority for r in rows}) > 1:
        return "priority"
    return None


def group_figures(rows: tuple[RequestRow, ...], lane: int, by: str | None) -> dict[str, dict[str, float | int]]:
    """Per group (tenant or priority), in one lane: requests, TTFT p50/p95, end-to-end p95 (s)."""
    groups: dict[str, list[RequestOutcome]] = {}
    for row in rows:
        o = row.outcomes[lane]
        if o is not None:
            groups.setdefault(group_of(row, by) if by else "all", []).append(o)
    out = {}
    for name in sorted(groups):
        os_ = groups[name]
        ttft, e2e = sorted(o.ttft_s for o in os_), sorted(o.e2e_s for o in os_)
        out[name] = {
            "requests": len(os_),
            "ttft_p50_s": percentile(ttft, 0.5),
            "ttft_p95_s": percentile(ttft, 0.95),
            "e2e_p95_s": percentile(e2e, 0.95),
            "preemptions": sum(o.preemptions for o in os_),
        }
    return out


def to_json(
    lanes: tuple[LaneView, ...], rows: tuple[RequestRow, ...], source: str, judging: Judging | None = None
) -> dict:
    """The whole comparison as plain JSON (``tinyllm whatif --json``): with ``judging``, each
    lane's goodput and share met, each request's verdict per lane, and the ranking's rule."""
    judging = judging or Judging()
    by = grouping(rows)
    ranking = rank(lanes, judging)
    summaries = [judging.summary(v) for v in lanes]
    verdicts = [judging.verdicts(v) for v in lanes]
    return {
        "source": source,
        "exact": "tokens, steps, admission order, preemptions, steps waited per reason",
        "clock_dependent": "every *_s figure, on each lane's own clock: its compute time, plus in wall_s the idle "
        "waits for arrivals (busy_s leaves them out)",
        "slo": None if judging.slo is None else str(judging.slo),
        "ranking": {"rule": ranking.rule, "by": ranking.by, "places": list(ranking.places)},
        "lanes": [
            {
                "name": v.title,
                "detail": v.detail,
                "seqs": v.seqs,
                "kv_mib": v.kv_mib,
                "kv_blocks": v.kv_blocks,
                "kv_dtype": v.kv_dtype,
                **({} if v.result is None else vars(v.result)),
                "groups": group_figures(rows, i, by),
                "place": ranking.places[i],
                "slo": None if summaries[i] is None else summaries[i].as_dict(),
            }
            for i, v in enumerate(lanes)
        ],
        "group_by": by,
        "requests": [
            {
                "rid": r.rid,
                "prompt_tokens": r.prompt_tokens,
                "new_tokens": r.new_tokens,
                "priority": r.priority,
                "tenant": r.tenant,
                "arrival_s": r.arrival_s,
                "e2e_change_vs_first_lane": None if r.ended else round(r.change, 4),
                "recorded_state": r.ended or None,  # aborted / failed: left out of the rankings
                "lanes": {
                    v.title: None
                    if o is None
                    else {
                        "ttft_s": o.ttft_s,
                        "itl_p99_s": o.itl_p99_s,
                        "e2e_s": o.e2e_s,
                        "preemptions": o.preemptions,
                        "waited_steps": dict(o.waited),
                        **verdict_json(verdicts[i].get(r.rid)),
                    }
                    for i, (v, o) in enumerate(zip(lanes, r.outcomes))
                },
            }
            for r in rows
        ],
    }


def verdict_json(v) -> dict:
    """A request's SLO verdict in one lane, for JSON (nothing without an SLO)."""
    if v is None:
        return {}
    return {"slo": {"outcome": v.outcome, "missed": list(v.missed), "reason": v.reason}}


def load_judging(source: str, slo: SLO | None) -> Judging:
    """The judging of a what-if's or a race's requests: the run's ``slo``; from a workload file,
    each line's own "slo" (a line of n samples: n requests); from a recording, how each request
    ended, the SLO each was recorded with (its own), and the recorded run's SLO where ``slo`` is
    None. In arrival order, as build_race numbers the requests (a stable sort by arrival)."""
    path = Path(source).expanduser()
    if path.exists() and is_recording(path):
        read = read_recording(path)
        views, _ = recorded_views(path, read)
        own = recorded_slos([rec for _, rec in read[1]])
        return Judging(
            slo or header_slo(read[0]), own=tuple(own.get(v.rid) for v in views), ended=tuple(v.state for v in views)
        )
    from tinyllm.workload import load_workload, resolve_workload

    items = load_workload(resolve_workload(source))
    per = sorted(((it.arrival_s, it.slo) for it in items for _ in range(it.n or 1)), key=lambda p: p[0])
    return Judging(slo, own=tuple(s for _, s in per))
