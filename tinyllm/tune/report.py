"""The tuner's answer: the best settings and the runners-up, the Pareto front, what changed for
the winner against the defaults, the wall-clock check, and the winner as command lines; as
tables for a terminal and as JSON for scripts. No torch at import.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table

from tinyllm.tune.commands import TRANSFER, commands
from tinyllm.tune.evaluate import Outcome
from tinyllm.tune.search import SearchResult, pareto_front
from tinyllm.tune.space import Point

SHOWN = 8  # the ranking's rows (the defaults' row is added when it falls below)


@dataclass(frozen=True)
class WallCheck:
    """The winner and the defaults raced again on the wall clock (the real model)."""

    winner: Outcome
    defaults: Outcome
    objective: str
    cost_winner: Outcome  # the cost clock's figures for the same requests
    cost_defaults: Outcome

    @property
    def holds(self) -> bool:
        from tinyllm.tune.search import score

        return score(self.winner, self.objective) <= score(self.defaults, self.objective)


def wall_line(wall: WallCheck, objective: str) -> str:
    """The wall-clock check in one line: both clocks' figures for the winner and the defaults."""
    a, b = (float(figure(o, objective).split()[0]) for o in (wall.winner, wall.defaults))
    close = " (by under 5%: within the wall clock's run-to-run noise)" if abs(a - b) < 0.05 * max(a, b) else ""
    verdict = (
        f"the ranking holds{close}"
        if wall.holds
        else "the ranking does NOT hold on the wall clock: this machine's step cost is not the profile's "
        "(busy, or a profile from elsewhere), or the margin is within its error"
    )
    w, c = wall.winner, wall.cost_winner
    pace = ""
    if w.steps and c.steps and c.busy_s:
        pace = f"; the real model's steps took {w.busy_s / w.steps / (c.busy_s / c.steps):.2g}x the profile's here"
    return (
        f"wall-clock check on the first {wall.winner.requests} requests (the real model; the winner and the "
        f"defaults in one race): {objective} winner {figure(wall.winner, objective)} (cost clock "
        f"{figure(wall.cost_winner, objective)}), defaults {figure(wall.defaults, objective)} (cost clock "
        f"{figure(wall.cost_defaults, objective)}){pace}: {verdict}"
    )


def figure(o: Outcome, objective: str) -> str:
    """The objective's figure for a point."""
    if o.error:
        return "refused"
    if objective == "goodput":
        return f"{o.goodput:.3f} req/s"
    if objective == "throughput":
        return f"{o.tok_s:.1f} tok/s"
    return f"{o.latency_p95_s:.2f} s"


def margin(winner: Outcome, base: Outcome, objective: str) -> str:
    """How much the winner beats the defaults, in the objective's terms."""
    a, b, unit, better = {
        "goodput": (winner.goodput, base.goodput, "req/s", 1),
        "throughput": (winner.tok_s, base.tok_s, "tok/s", 1),
        "latency-p95": (winner.latency_p95_s, base.latency_p95_s, "s", -1),
    }[objective]
    if a == b:
        return f"ties the defaults on {objective} ({a:.3g} {unit})"
    rel = f" ({(a - b) / b:+.0%})" if b else ""
    word = "beats" if (a - b) * better > 0 else "trails"
    return f"{word} the defaults on {objective}: {a:.3g} against {b:.3g} {unit}{rel}"


def ranking_table(result: SearchResult, objective: str, base: Point, slo_active: bool) -> Table:
    t = Table(title=f"best settings for {objective} (on all {result.final[0].requests} requests)", title_justify="left")
    for col in ("#", "settings (against the defaults)", objective, "met", "TTFT p95", "latency p95", "preempted"):
        t.add_column(col, justify="left" if col.startswith("settings") else "right")
    t.add_column("peak KV", justify="right")
    rows = list(enumerate(result.final, 1))
    shown = rows[:SHOWN] + [(i, o) for i, o in rows[SHOWN:] if o.point == base]
    for i, o in shown:
        name = "the defaults" if o.point == base else o.point.words(base)
        if o.error:
            t.add_row(str(i), name, "refused", "", "", "", "", "")
            continue
        t.add_row(
            str(i),
            name,
            figure(o, objective),
            f"{o.met}/{o.judged}" if slo_active else "—",
            f"{o.ttft_p95_s * 1e3:.0f} ms",
            f"{o.latency_p95_s:.2f} s",
            str(o.preemptions),
            f"{o.peak_kv_mib:.2f} MiB",
        )
    return t


def front_table(front: list[Outcome], base: Point) -> Table:
    t = Table(title="Pareto front: goodput against the KV memory held at peak", title_justify="left")
    for col in ("peak KV", "goodput", "settings"):
        t.add_column(col, justify="left" if col == "settings" else "right")
    for o in front:
        t.add_row(
            f"{o.peak_kv_mib:.2f} MiB",
            f"{o.goodput:.3f} req/s",
            "the defaults" if o.point == base else o.point.words(base),
        )
    return t


def changes(winner: Outcome, base: Outcome) -> list[tuple[str, str, str]]:
    """(what, the defaults, the winner): the figures that say why the winner wins."""
    waits = sorted(set(dict(winner.waits)) | set(dict(base.waits)))

    def w(o: Outcome) -> str:
        d = dict(o.waits)
        return ", ".join(f"{k} {d[k]}" for k in waits if d.get(k)) or "none"

    def miss(o: Outcome) -> str:
        return ", ".join(f"{k} {n}" for k, n in o.missed_by_reason) or "none"

    rows = [
        ("goodput", f"{base.goodput:.3f} req/s", f"{winner.goodput:.3f} req/s"),
        ("met the SLO", f"{base.met}/{base.judged}", f"{winner.met}/{winner.judged}"),
        ("misses by reason", miss(base), miss(winner)),
        ("TTFT p95", f"{base.ttft_p95_s * 1e3:.0f} ms", f"{winner.ttft_p95_s * 1e3:.0f} ms"),
        ("latency p95", f"{base.latency_p95_s:.2f} s", f"{winner.latency_p95_s:.2f} s"),
        ("queueing (mean per request)", f"{base.queued_mean_s * 1e3:.0f} ms", f"{winner.queued_mean_s * 1e3:.0f} ms"),
        ("steps waited by reason", w(base), w(winner)),
        ("preemptions", str(base.preemptions), str(winner.preemptions)),
        (
            "wasted rows",
            f"{base.wasted_rows} of {base.computed_rows}",
            f"{winner.wasted_rows} of {winner.computed_rows}",
        ),
        ("prefill tokens computed", str(base.prefill_tokens), str(winner.prefill_tokens)),
        ("prefix cache hits (tokens)", str(base.prefix_hits), str(winner.prefix_hits)),
        ("KV pool", f"{base.kv_blocks} blocks", f"{winner.kv_blocks} blocks"),
        ("peak KV", f"{base.peak_kv_mib:.2f} MiB", f"{winner.peak_kv_mib:.2f} MiB"),
        ("steps · busy", f"{base.steps} · {base.busy_s:.2f} s", f"{winner.steps} · {winner.busy_s:.2f} s"),
    ]
    return rows


def changes_table(winner: Outcome, base: Outcome) -> Table:
    t = Table(title="what changed for the winner against the defaults", title_justify="left")
    for col in ("", "defaults", "winner"):
        t.add_column(col)
    for row in changes(winner, base):
        t.add_row(*row)
    return t


def reverted(winner: Point, base: Point) -> list[tuple[str, Point]]:
    """The winner with one of its changes undone (back at the defaults' value), per change that
    leaves a point an engine can run: (the setting's short name, the point)."""
    from dataclasses import fields, replace

    out = []
    for f in fields(winner):
        if getattr(winner, f.name) == getattr(base, f.name):
            continue
        p = replace(winner, **{f.name: getattr(base, f.name)}).canonical()
        if p != winner and not p.valid():
            out.append((f.name, p))
    return out


def ablation_table(winner: Outcome, undone: list[tuple[str, Outcome]], objective: str) -> Table:
    """What each of the winner's changes is worth: the winner with that one change undone."""
    t = Table(title="each change's part: the winner with one change undone", title_justify="left")
    for col in ("undone", objective, "met", "preempted", "TTFT p95"):
        t.add_column(col, justify="left" if col == "undone" else "right")
    t.add_row(
        "(none: the winner)",
        figure(winner, objective),
        f"{winner.met}/{winner.judged}",
        str(winner.preemptions),
        f"{winner.ttft_p95_s * 1e3:.0f} ms",
    )
    for name, o in undone:
        said = o.point.words(winner.point) or name  # the undone setting at the defaults' value
        if o.error:
            t.add_row(f"back to {said}", "refused", "", "", "")
            continue
        t.add_row(
            f"back to {said}",
            figure(o, objective),
            f"{o.met}/{o.judged}",
            str(o.preemptions),
            f"{o.ttft_p95_s * 1e3:.0f} ms",
        )
    return t


def to_json(
    result: SearchResult,
    objective: str,
    base: Point,
    header: dict,
    wall: WallCheck | None,
    commands: dict,
    undone: list[tuple[str, Outcome]] = (),
) -> dict:
    """The whole answer. ``measured`` holds the only figures that change run to run."""
    winner = result.final[0]
    return {
        **header,
        "objective": objective,
        "method": result.method,
        "configurations": result.points,
        "runs": result.runs,
        "rungs": [
            {"requests": r.requests, "kept": r.kept, "outcomes": [o.as_dict() for o in r.outcomes]}
            for r in result.rungs
        ],
        "stopped": result.stopped or None,
        "winner": winner.as_dict(),
        "nothing_meets_slo": nothing_meets(result, header.get("slo") is not None),  # then "winner" is the closest
        "defaults": result.defaults.as_dict(),
        "margin": margin(winner, result.defaults, objective),
        "ranking": [o.as_dict() for o in result.final],
        "pareto_front": [o.as_dict() for o in pareto_front(result.final)],
        "changes": [{"what": a, "defaults": b, "winner": c} for a, b, c in changes(winner, result.defaults)],
        "one_change_undone": [{"setting": name, **o.as_dict()} for name, o in undone],
        "commands": commands,
        "transfer": TRANSFER,
        "measured": {
            "search_s": round(result.seconds, 3),
            "wall_check": None
            if wall is None
            else {
                "requests": wall.winner.requests,
                "winner": wall.winner.as_dict(),
                "defaults": wall.defaults.as_dict(),
                "cost_clock_winner": wall.cost_winner.as_dict(),
                "cost_clock_defaults": wall.cost_defaults.as_dict(),
                "ranking_holds": wall.holds,
            },
        },
    }


def nothing_meets(result: SearchResult, slo_active: bool) -> bool:
    """An SLO and not one request, in any configuration tried, that met it: there is no winner."""
    return slo_active and all(o.met == 0 for r in result.rungs for o in r.outcomes if not o.error)


def print_answer(s, answer, out) -> None:
    """The answer on ``out`` (anything with rich's ``print``: a Console, the live view's log)."""
    from tinyllm.race.calibrate import describe

    args, bench, base, kv_mib = s.args, s.bench, s.base, s.kv_mib
    result, undone, wall = answer.result, answer.undone, answer.wall
    winner = result.final[0]
    n = len(bench.arrivals)
    slo = bench.judging.slo
    arrivals = any(t > 0 for t, _ in bench.arrivals)
    span = bench.arrivals[-1][0] if arrivals else 0.0
    out.print(
        f"tune {args.source}: {n} requests"
        + (f" arriving over {span:.1f} s" if arrivals else " all at once")
        + (f" (--rate {args.rate:g}/s)" if args.rate else "")
        + f"; SLO {slo or 'per request'}; KV memory {kv_mib:g} MiB"
        + ("" if args.kv_memory else " (the defaults' 8 slots of max_len: --kv-memory sets it)")
        + f"; objective {args.objective}",
        highlight=False,
    )
    rungs = ", ".join(f"{len(r.outcomes)} on {r.requests} requests" for r in result.rungs)
    out.print(
        f"searched {result.points} configurations by {result.method} ({rungs}; {result.runs} runs in "
        f"{result.seconds:.0f} s, {args.jobs} process{'es' * (args.jobs > 1)}"
        + ("; on a one-layer stand-in model" if args.stand_in else "")
        + (
            ", speculating ones on the real model (the drafts kept follow its text)"
            if args.stand_in and any(p.num_speculative_tokens for p in s.grid)
            else ""
        )
        + ")",
        highlight=False,
    )
    out.print(describe(bench.clock), highlight=False)
    if result.stopped:
        out.print(f"[yellow]{result.stopped}[/]")
    out.print(ranking_table(result, args.objective, base, bench.judging.active))
    refused = {o.point: o.error for r in result.rungs for o in r.outcomes if o.error}
    if refused:
        first = next(iter(refused.values()))
        out.print(f"{len(refused)} configuration(s) refused by the engine, e.g.: {first}", highlight=False)
    front = pareto_front(result.final)
    out.print(front_table(front, base))
    name = "the defaults" if winner.point == base else winner.point.words(base)
    if nothing_meets(result, bench.judging.active):  # no winner: say so, and what came closest
        tried = sum(len(r.outcomes) for r in result.rungs)
        out.print(
            f"[bold yellow]nothing meets the SLO here:[/] none of the {tried} runs of {result.points} "
            f"configurations had a request meet {slo} (goodput 0 everywhere), so there is no winner. The table "
            "ranks them by how close they came (latency p95, lowest first); relax the SLO, lower --rate or give "
            "more --kv-memory.",
            highlight=False,
        )
        out.print(
            f"closest: {name} — latency p95 {winner.latency_p95_s:.2f} s, TTFT p95 {winner.ttft_p95_s:.2f} s "
            f"(the defaults: {result.defaults.latency_p95_s:.2f} s, {result.defaults.ttft_p95_s:.2f} s)",
            highlight=False,
        )
        out.print(TRANSFER, highlight=False)
        return
    out.print(f"winner: {name} — {margin(winner, result.defaults, args.objective)}", highlight=False)
    if winner.point != base:
        out.print(changes_table(winner, result.defaults))
    if undone:
        out.print(ablation_table(winner, undone, args.objective))
    if wall is not None:
        out.print(wall_line(wall, args.objective), highlight=False)
    serve, vllm, notes = commands(s, winner.point)
    out.print("\nthe winner as command lines:", highlight=False)
    if winner.point.chunked_prefill:
        out.print(f"  {serve}", highlight=False, soft_wrap=True)
    else:
        out.print(
            "  tinyllm serve always runs chunked prefill; the winner's prefill-then-decode scheduler runs in "
            "tinyllm-tui --kv paged --no-chunked-prefill",
            highlight=False,
        )
    out.print(f"  {vllm}", highlight=False, soft_wrap=True)
    for note in notes:
        out.print(f"    ({note})", highlight=False)
    out.print(TRANSFER, highlight=False)


def answer_json(s, answer) -> dict:
    """The whole answer as JSON (--json)."""
    args, bench = s.args, s.bench
    slo = bench.judging.slo
    header = {
        "source": args.source,
        "requests": len(bench.arrivals),
        "rate": args.rate,
        "slo": None if slo is None else str(slo),
        "kv_memory_mib": s.kv_mib,
        "max_len": bench.max_len,
        "clock": {"kind": "cost", **vars(bench.clock)},
        "stand_in": args.stand_in,
    }
    serve, vllm, notes = commands(s, answer.result.final[0].point)
    cmds = {"tinyllm_serve": serve, "vllm": vllm, "notes": notes}
    return to_json(answer.result, args.objective, s.base, header, answer.wall, cmds, answer.undone)
