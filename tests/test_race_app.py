"""The race in the app (Pilot): run to the finish step by step against the headless paths, keys,
arrivals, the main app's `r` key, snapshots, the command line and the engine process.

Uses test_app's helpers and its no-error guard (imported: every app a test makes is watched)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.helpers import race_run
from tests.test_app import _watch, bundled, make_app, no_unexpected_errors, until, watched_app  # noqa: F401
from tinyllm.engine import Request, run_continuous, run_static
from tinyllm.model.checkpoint import default_model_dir
from tinyllm.workload import resolve_workload
from tui.cli import build_app
from tui.runners.child import ChildRunner
from tui.runners.interface import SetPaused, StepOnce
from tui.runners.race import RaceRunner, RaceSpec, Restart, race_workload
from tui.screens.modals import HelpScreen
from tui.screens.race import FinishLine, RaceApp, RaceScreen
from tui.widgets.lane_panel import LanePanel
from tui.widgets.race_track import RaceTrack

SLOTS, MAX_LEN, BLOCK, BUDGET = 3, 256, 8, 32


def small_work(n: int = 6, cap: int = 16, arrivals: tuple[float, ...] | None = None):
    """The first ``n`` requests of the bundled mixed_lengths workload, at most ``cap`` new tokens."""
    work = race_workload(resolve_workload("mixed_lengths"), bundled()[1].encode, MAX_LEN)[:n]
    return tuple(
        (arrivals[i] if arrivals else 0.0, ids, min(new, cap), prio, tenant)
        for i, (_, ids, new, prio, tenant) in enumerate(work)
    )


def chunked_stats(model, reqs, **kw) -> dict:
    """The chunked lane's run, headless: its stats."""
    return run_continuous(
        model,
        reqs,
        SLOTS,
        max_len=MAX_LEN,
        kv="paged",
        block_size=BLOCK,
        chunked_prefill=True,
        max_batched_tokens=BUDGET,
        **kw,
    )[1]


def mini_spec(work, slots: int = SLOTS, **kw) -> RaceSpec:
    """The tests' race: ``work`` (named "mini") at MAX_LEN, no warm-up; the rest as given (the
    engine's settings in the race's option names: race_run's, and device, threads)."""
    from tinyllm.config import EngineConfig

    engine = {k: kw.pop(k) for k in list(kw) if k in ("device", "threads")}
    settings = {k: kw.pop(k) for k in list(kw) if k in EngineConfig.settings() or k == "kv_memory_mib"}
    run = race_run(slots, MAX_LEN, **settings).replace(**engine)
    return RaceSpec(str(default_model_dir()), work, "mini", run, warm_up=False, **kw)


def race_app(
    work,
    slots: int = SLOTS,
    paused: bool = True,
    step_cost_s: float | None = 0.01,
    lanes: tuple | None = None,
    **spec_kw,
) -> RaceApp:
    """A race in a thread of the test (RaceRunner), paused, on a fixed-cost clock: deterministic."""
    model, _ = bundled()
    spec = mini_spec(
        work,
        slots,
        block_size=BLOCK,
        max_batched_tokens=BUDGET,
        step_cost_s=step_cost_s,
        **({} if lanes is None else {"lanes": lanes}),
        **spec_kw,
    )
    runner = RaceRunner(lambda: spec.make_race(model), paused=paused, device="cpu", threads=1)
    app = RaceApp(runner, workload="mini", model_name="test")
    _watch(app)
    return app


async def step_to(pilot, turns: int) -> None:
    """Press `n` until the race has made ``turns`` steps (or is over). To the finish (10,000):
    space runs it flat out, then pauses: the clocks are fixed-cost or priced, so the figures are
    those of stepping by hand, and a press per step cost seconds per race."""
    r = pilot.app.runner
    if turns >= 10_000 and r.frame.paused and not r.frame.done:
        await pilot.press("space")
        await until(pilot, lambda: r.frame.done, timeout=120, what="the finish")
        return
    while r.frame.turns < turns and not r.frame.done:
        n = r.frame.turns
        await pilot.press("n")
        await until(pilot, lambda: r.frame.turns == n + 1 or r.frame.done, what=f"step {n + 1}")


def plain(app, widget) -> str:
    """The widget's text as drawn at its own width."""
    options = app.console.options.update_width(widget.size.width)
    return "".join(seg.text for seg in app.console.render(widget.render(), options))


async def test_a_race_run_to_the_finish_agrees_with_the_headless_paths():
    work = small_work()
    app = race_app(work)
    async with app.run_test(size=(120, 40)) as pilot:
        await step_to(pilot, 10_000)
        frame = app.runner.frame
        assert frame.done and app.screen.query_one(FinishLine).display
        table = plain(app, app.screen.query_one(FinishLine)).splitlines()
        model, _ = bundled()
        reqs = [Request(list(ids), new) for _, ids, new, _, _ in work]
        headless = {
            "static": run_static(model, reqs, SLOTS)[1],
            "continuous": run_continuous(model, reqs, SLOTS, max_len=MAX_LEN)[1],
            "chunked": chunked_stats(model, reqs),
        }
        names = {"static": "static", "continuous": "continuous", "chunked": "budget+cache"}
        for lane in frame.lanes:
            want = headless[lane.key]
            assert (lane.result.decode_steps, lane.result.row_util) == (want["decode_steps"], want["row_util"])
            assert lane.result.useful_tokens == want["useful_tokens"] == sum(w[2] for w in work)
            row = next(line.split() for line in table if line.split()[:1] == [names[lane.key]])
            assert row[-1] == f"{want['decode_steps']:,}" and f"{want['row_util']:.0%}" in row
        walls = {v.title: v.result.wall_s for v in frame.lanes}
        order = [e.text.split(" finished ")[0] for e in frame.log if e.kind == "finish"]
        assert sorted(order) == sorted(walls) and [walls[t] for t in order] == sorted(walls.values())
        assert "FINISHED" in app.screen.query_one("#race-status").text.plain


async def test_the_finish_line_counts_preemptions_where_a_lane_preempted():
    """A pool of 6 blocks of 8 for 3 sequences of up to 22 tokens: the chunked lane preempts, as
    the same requests do headless on that pool; the finish line had no column that said so."""
    work = small_work()
    app = race_app(work, kv_blocks=6)
    async with app.run_test(size=(160, 40)) as pilot:
        await step_to(pilot, 10_000)
        frame = app.runner.frame
        model, _ = bundled()
        reqs = [Request(list(ids), new) for _, ids, new, _, _ in work]
        want = chunked_stats(model, reqs, kv_blocks=6)["preemptions"]
        results = {v.key: v.result for v in frame.lanes}
        assert want > 0 and results["chunked"].preemptions == want
        assert results["static"].preemptions == results["continuous"].preemptions == 0
        table = plain(app, app.screen.query_one(FinishLine)).splitlines()
        header = next(line.split() for line in table if "tok/s" in line)
        column = header.index("preempted") - len(header)  # counted from the right
        for key, name in (("static", "static"), ("continuous", "continuous"), ("chunked", "budget+cache")):
            row = next(line.split() for line in table if line.split()[:1] == [name])
            assert row[column] == f"{results[key].preemptions:,}"
    app = race_app(work)  # no lane preempts: no column
    async with app.run_test(size=(160, 40)) as pilot:
        await step_to(pilot, 10_000)
        assert "preempted" not in plain(app, app.screen.query_one(FinishLine))


async def test_with_arrivals_the_finish_line_ranks_by_latency_and_shows_each_lanes_compute():
    """Requests arriving over time: every lane's clock runs to about the last arrival, so tok/s is
    the rate they came at in every lane and the place (by finishing time) was noise that put the
    lane with the lowest latency last. The place is by latency p95 now, and busy (the clock less
    its waits for arrivals) says what each lane computed."""
    work = small_work(n=6, arrivals=(0.0, 0.3, 0.6, 0.9, 1.2, 1.5))
    from tinyllm.units import duration

    app = race_app(work)
    async with app.run_test(size=(160, 40)) as pilot:
        await step_to(pilot, 10_000)
        lanes = app.runner.frame.lanes
        for v in lanes:
            steps = round(v.result.busy_s / 0.01)  # the fixed-cost clock: 10 ms a step
            assert 0 < v.result.busy_s < v.result.wall_s and v.result.busy_s == pytest.approx(steps * 0.01)
        text = plain(app, app.screen.query_one(FinishLine))
        assert "requests arrived over time" in text and "ranked by latency p95" in " ".join(text.split())
        table = text.splitlines()
        assert next(line.split() for line in table if line.split()[:1] == ["lane"])[1] == "place"
        by_latency = sorted(lanes, key=lambda v: v.result.latency_p95_s)
        names = {"static": "static", "continuous": "continuous", "chunked": "budget+cache"}
        for v in lanes:
            row = next(line.split() for line in table if line.split()[:1] == [names[v.key]])
            assert row[1] == str(by_latency.index(v) + 1) and duration(v.result.busy_s) in row
    app = race_app(small_work())  # all at once: no busy column
    async with app.run_test(size=(160, 40)) as pilot:
        await step_to(pilot, 10_000)
        assert "busy" not in plain(app, app.screen.query_one(FinishLine))


def test_steps_timed_after_a_pause_are_counted_and_the_finish_line_says_so():
    """--step-delay 50 ran the same race at 2-2.5x lower tok/s: a step after a pause finds its
    caches cold and its lane's clock (real time) reads high. The runner counts such steps on a
    measured clock: each step by hand, the first after a resume, every step with a step delay;
    a restart starts over, and a fixed-cost clock or the cost clock counts none."""
    model, _ = bundled()

    def runner(step_cost_s, clock="wall"):
        spec = mini_spec(
            small_work(n=2, cap=4), 2, block_size=BLOCK, max_batched_tokens=BUDGET, step_cost_s=step_cost_s, clock=clock
        )
        return RaceRunner(lambda: spec.make_race(model), paused=True, device="cpu", threads=1)

    r = runner(None)
    r._apply(StepOnce())
    r._apply(StepOnce())  # two by hand
    r._apply(SetPaused(False))
    r._step()  # the first after resuming
    r._step()  # flat out: warm
    r.step_delay_ms = 50
    r._step()  # slow motion
    assert r._make_frame().cold_steps == 4 and r._make_frame().turns == 5
    r._apply(Restart())
    r.step_delay_ms = 0
    r._step()
    assert r._make_frame().cold_steps == 0
    for other in (runner(0.01), runner(None, clock="cost")):  # clocks that time no step: nothing cold
        other._apply(StepOnce())
        assert other._make_frame().cold_steps == 0


async def test_the_finish_line_says_a_bfloat16_lanes_memory_as_its_title_does():
    """The title said `4 seqs · 6 MiB bf16`, the finish line `4 · 6 MiB`: the same memory holding
    twice the tokens, unsaid."""
    from tinyllm.race.spec import parse_lanes

    app = race_app(small_work(n=4, cap=4), lanes=parse_lanes(["static kv_mib=6", "chunked kv_mib=6 kv_dtype=bf16"]))
    async with app.run_test(size=(160, 40)) as pilot:
        await step_to(pilot, 10_000)
        lanes = {v.kind: v for v in app.runner.frame.lanes}
        text = plain(app, app.screen.query_one(FinishLine))
        assert f"{lanes['chunked'].seqs} · 6 MiB bf16" in text and f"{lanes['static'].seqs} · 6 MiB " in text
        assert "bf16" in lanes["chunked"].capacity and "bf16" not in lanes["static"].capacity


async def test_the_finish_line_says_when_steps_ran_after_pauses():
    app = race_app(small_work(n=2, cap=4))
    async with app.run_test(size=(160, 40)) as pilot:
        await step_to(pilot, 10_000)
        finish = app.screen.query_one(FinishLine)
        assert "after a pause" not in plain(app, finish)
        # the clock it rests on, on screen (the log said it, and the screen shows only errors)
        assert "each lane's own clock on a fixed 0.01 s a step" in " ".join(plain(app, finish).split())
        finish.show(app.runner.frame.lanes, 7, app.runner.frame.turns, app.runner.frame.clock)
        await pilot.pause()
        text = " ".join(plain(app, finish).split())
        assert f"7 of its {app.runner.frame.turns:,} steps ran after a pause (slow motion or stepped by hand)" in text
        options = app.console.options.update_width(finish.size.width)
        drawn = len(app.console.render_lines(finish.render(), options, pad=False))
        assert finish.size.height >= drawn  # the wrapped title costs no lane row


async def test_race_keys_pause_step_speed_restart_and_help():
    app = race_app(small_work())
    r = app.runner
    async with app.run_test(size=(100, 30)) as pilot:
        await step_to(pilot, 3)
        await pilot.press("plus", "plus")
        await until(pilot, lambda: r.frame.step_delay_ms == 10)
        await pilot.press("minus")
        await until(pilot, lambda: r.frame.step_delay_ms == 5)
        await pilot.press("space")  # runs on its own, slowly
        await until(pilot, lambda: r.frame.turns >= 8)
        await pilot.press("n")  # not while running: says so
        await until(pilot, lambda: any("works while paused" in m for _, _, m in app.notified))
        await pilot.press("space")
        await until(pilot, lambda: r.frame.paused)
        n = r.frame.turns
        time.sleep(0.2)
        assert r.frame.turns == n  # paused: no steps
        await pilot.press("r")
        await until(pilot, lambda: r.frame.turns == 0 and not any(v.tokens for v in r.frame.lanes))
        assert app.screen.check_action("back", ()) is False  # the whole app: no screen to go back to
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert ("r", "Run again") in app.screen.rows()
        assert dict(app.screen.rows())["ctrl+p"].startswith("the command palette")
        assert "Back to the app" not in [what for _, what in app.screen.rows()]  # (no app to go back to)
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, RaceScreen))


async def test_a_workload_with_arrivals_is_raced_and_static_says_what_it_waits_for():
    app = race_app(small_work(arrivals=(0.0, 0.0, 0.05, 0.3, 0.31, 2.0)))
    app.work = small_work()
    async with app.run_test(size=(160, 48)) as pilot:
        panel = app.screen.query_one("#lane-static", LanePanel)
        assert "starts a batch when 3 wait or the oldest has waited 1 s" in " ".join(plain(app, panel).split())
        waits = set()
        while not app.runner.frame.done:
            await step_to(pilot, app.runner.frame.turns + 1)
            waits |= {line.strip() for line in plain(app, panel).splitlines() if "full batch" in line}
        assert "waits for a full batch: 2/3, or until 1.00 s" in waits
        results = {v.key: v.result for v in app.runner.frame.lanes}
        assert {r.useful_tokens for r in results.values()} == {sum(w[2] for w in app.work)}
        assert results["static"].ttft_p50_s > results["continuous"].ttft_p50_s


async def open_race(pilot):
    """Press r in the app; its race's runner, once the race screen is up."""
    app = pilot.app
    app.query_one("#requests").focus()
    await pilot.press("r")
    await until(pilot, lambda: isinstance(app.screen, RaceScreen))
    return app.screen.runner


async def status_says(pilot, text: str) -> None:
    """Until the race's status line holds ``text``."""
    status = pilot.app.screen.query_one("#race-status")
    await until(pilot, lambda: text in status.text.plain, what="the status line")


async def back_to_the_app(pilot) -> None:
    await pilot.press("escape")
    await until(pilot, lambda: not isinstance(pilot.app.screen, RaceScreen))


async def test_r_in_the_app_opens_the_race_on_its_model_and_escape_comes_back():
    app = make_app(new=100)
    async with app.run_test(size=(120, 40)) as pilot:
        app.runner.send(SetPaused(False))
        app.query_one("#requests").focus()
        await until(pilot, lambda: not app.runner.paused)
        assert app._applies("race")  # (in the palette: tests/test_app_palette.py)
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, RaceScreen))
        race = app.screen.runner
        await until(pilot, lambda: app.runner.paused, what="the app's engine to wait during the race")
        await until(pilot, lambda: race.frame.turns >= 3, what="the race to run")
        assert [v.key for v in race.frame.lanes] == ["static", "continuous", "chunked"]
        assert race.frame.lanes[0].total == 16  # the default workload, mixed_lengths
        assert app.check_action("toggle_pause", ()) is False  # the app's keys are off meanwhile
        await pilot.press("space")  # ... so space pauses the race
        await until(pilot, lambda: race.frame.paused)
        await back_to_the_app(pilot)
        await until(pilot, lambda: not app.runner.paused, what="the app's engine to resume")
        assert race._stop.is_set()


async def test_r_races_the_workload_the_app_loaded_and_says_which():
    """`r` once raced mixed_lengths whatever the app had loaded, and nothing said so."""
    app = make_app(max_len=512, prompts_file=resolve_workload("shared_prefix"))
    async with app.run_test(size=(160, 40)) as pilot:
        await until(pilot, lambda: app.runner.frame.snapshot.requests, what="the app to load its prompts")
        race = await open_race(pilot)
        assert race.frame.lanes[0].total == 8  # shared_prefix's, not mixed_lengths' 16
        await status_says(pilot, "shared_prefix (loaded in the app)")
        await back_to_the_app(pilot)


async def test_r_with_no_prompts_loaded_says_it_races_the_default():
    app = make_app()
    async with app.run_test(size=(160, 40)) as pilot:
        race = await open_race(pilot)
        assert race.frame.lanes[0].total == 16
        await status_says(pilot, "mixed_lengths (the race's default: no prompts loaded)")
        await back_to_the_app(pilot)


async def _race_from_r(pilot) -> dict:
    """Press r in the app; once the race has made a step, its lanes by key."""
    race = await open_race(pilot)
    await until(pilot, lambda: race.frame.turns >= 1, what="the race to run")
    return {v.key: v for v in race.frame.lanes}


async def test_r_races_at_the_apps_max_len_and_pool_where_its_requests_fit():
    """`r` once raced at 512 tokens and the race's own pool whatever the app ran: an app started
    with --max-len 256 --kv-blocks 40 (to watch preemption) got a race with 3 x 512 / 8 = 192
    blocks. A max_len the workload does not fit falls back to the race's, and the status says so."""
    app = make_app(kv="paged", slots=3, max_len=256, kv_blocks=40)  # (blocks of 8)
    async with app.run_test(size=(160, 40)) as pilot:
        lanes = await _race_from_r(pilot)
        assert lanes["chunked"].kv_blocks == 40
        assert lanes["continuous"].kv_reserved == 3 * 256  # its slots of the app's max_len
        status = app.screen.query_one("#race-status").text.plain
        assert "at max_len" not in status
        await back_to_the_app(pilot)
    app = make_app(kv="paged", slots=3, max_len=128, kv_blocks=40)  # mixed_lengths needs 223 tokens
    async with app.run_test(size=(160, 40)) as pilot:
        lanes = await _race_from_r(pilot)
        assert lanes["continuous"].kv_reserved == 3 * 512 and lanes["chunked"].kv_blocks == 3 * 512 // 8
        await status_says(pilot, "at max_len 512: its requests do not fit the app's 128")
        await back_to_the_app(pilot)


def _snap_app(turns: int | None):
    app = race_app(small_work(n=8, cap=24), slots=4)

    async def run_before(pilot):
        await step_to(pilot, turns if turns is not None else 10_000)
        pilot.app.refresh_from_runner(force=True)
        await pilot.pause(0.2)

    return app, run_before


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
@pytest.mark.parametrize("when", ["mid-race", "finish"])
def test_race_snapshot(snap_compare, size, when):
    app, run_before = _snap_app(40 if when == "mid-race" else None)
    assert snap_compare(app, terminal_size=size, run_before=run_before)


# -- the command line -------------------------------------------------------------------------------
def _too_long_together(tmp_path) -> str:
    """Each request fits alone; left-padded into one static batch they do not."""
    path = tmp_path / "long.jsonl"
    path.write_text(
        '{"prompt": "%s", "max_new_tokens": 10}\n{"prompt": "ROMEO:", "max_new_tokens": 300}\n' % ("word " * 250)
    )
    return str(path)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--race", "nope"], "--race: nope: no such file, and not a bundled workload"),
        (["--race", "--lanes", "static"], "--lanes: a race needs at least two lanes, got 1"),
        (
            ["--race", "--lanes", "static,turbo"],
            "'turbo' is neither a lane kind (static, continuous, chunked) nor a policy",
        ),
        (["--race", "--lanes", "fcfs", "budget=x"], "lane 'budget=x': budget must be an integer >= 1, got 'x'"),
        (
            ["--race", "--lanes", "fcfs priority", "chunked"],
            "lane 'fcfs priority': policy is given twice; a lane has one",
        ),
        (["--race", "--lanes", "static continuous", "chunked"], "lane 'static continuous': its kind is given twice"),
        (["--race", "--lanes", "fcfs policy=fair", "chunked"], "lane 'fcfs policy=fair': policy is given twice"),
        (["--race", "--lanes", "budget=8 budget=9", "chunked"], "lane 'budget=8 budget=9': budget is given twice"),
        (
            ["--race", "--lanes", "chunked block=8 block=16", "static"],
            "lane 'chunked block=8 block=16': block is given twice",
        ),
        (["--race", "--lanes", "blocks=40 blocks=50", "static"], "lane 'blocks=40 blocks=50': blocks is given twice"),
        (["--race", "--lanes", "static chunked=on", "fcfs"], "lane 'static chunked=on': its kind is given twice"),
        (
            ["--race", "--scheduling-policy", "fair"],
            "--scheduling-policy does not apply to --race (each lane has its own",
        ),
        (["--batch-timeout", "1"], "--batch-timeout applies to --race only"),
        (["--lanes", "static,chunked"], "--lanes applies to --race only"),
        (["--race", "--kv", "paged"], "--kv does not apply to --race"),
        (["--race", "--no-prefix-cache"], "--[no-]prefix-cache does not apply to --race"),
        (["--race", "burst", "--prompts", "burst"], "--prompts does not apply to --race (give the workload to --race)"),
        (
            ["--race", "--slots", "8", "--max-batched-tokens", "4"],
            "the chunked lane: its token budget 4 is less than its 8 slots",
        ),  # (no --lanes given: not "--lanes")
        (["--race", "--batch-timeout", "-1"], "expected a finite number >= 0"),
        (
            ["--race", "--lanes", "fcfs", "priority", "--batch-timeout", "5"],
            "--batch-timeout is static batching's wait for a full batch, and no lane here is static",
        ),
        (["--race", "--batch-timeout", "5"], "--batch-timeout: every request of mixed_lengths arrives at once"),
        (["--race", "--max-len", "4096"], "--max-len 4096 is more than the model's context"),
        (["--race", "{long}"], "static batching pads requests 0..1 to"),
        (["--race", "--kv-memory", "0"], "argument --kv-memory: expected a finite number > 0, got 0"),
        (["--race", "--kv-memory", "nan"], "argument --kv-memory: expected a finite number > 0, got nan"),
        (["--race", "--kv-memory", "8", "--kv-blocks", "9"], "--kv-memory sizes every lane's KV: drop --kv-blocks"),
        (["--race", "--max-num-seqs", "9"], "--max-num-seqs goes with --kv-memory (or a lane's kv_mib=)"),
        (
            ["--race", "--slots", "4", "--kv-memory", "8"],
            "--slots is the number of sequences without a KV budget: with "
            "--kv-memory the budget sizes the cache and --max-num-seqs caps",
        ),
        (
            ["--race", "--lanes", "static", "chunked kv_mib=-2"],
            "lane 'chunked kv_mib=-2': kv_mib must be a number of MiB > 0, got '-2'",
        ),
        (
            ["--race", "--kv-memory", "8", "--lanes", "static", "chunked blocks=9"],
            "lane 'chunked blocks=9': blocks= sizes the pool, and so does --kv-memory: give one",
        ),
        (
            ["--race", "--kv-memory", "8", "--max-num-seqs", "300"],
            "its token budget 256 is less than its 300 sequences",
        ),
        # the race's own per-request rule, before the UI (it once came up, then closed with this)
        (
            ["--race", "--kv-blocks", "1"],
            "lane 'chunked': 223 tokens need 14 blocks of 16, but the pool has only 1 block "
            "(16 tokens): raise --kv-blocks to 14",
        ),
        (
            ["--race", "--lanes", "static", "continuous", "--kv-blocks", "1"],  # no lane has blocks: was ignored
            "--kv-blocks sizes the paged lanes' KV pool, and no lane here is paged ('static', 'continuous': static "
            "batching and slot KV hold --max-len tokens per row): drop it, or add a lane such as chunked or "
            '"continuous kv=paged"',
        ),
        (
            ["--race", "--lanes", "static", "continuous", "--block-size", "8"],
            "--block-size sizes the paged lanes' KV pool",
        ),
        (
            ["--race", "--lanes", "static", "continuous kv=paged block=8 blocks=27"],
            "lane 'continuous kv=paged block=8 blocks=27': 223 tokens need 28 blocks of 8, but the pool has only 27 blocks "
            "(216 tokens): raise its blocks= to 28",
        ),
    ],
)
def test_race_options_are_checked_in_one_line(argv, message, tmp_path, capsys):
    argv = [a.replace("{long}", _too_long_together(tmp_path)) for a in argv]
    with pytest.raises(SystemExit) as e:
        build_app(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1, err


def test_race_kv_blocks_that_hold_the_longest_request_are_accepted():
    """The check above is the race's rule, no stricter: 14 blocks of 16 hold mixed_lengths' 223 tokens."""
    from tui.cli import build_parser, parse, race_spec

    parser = build_parser()
    assert race_spec(parser, parse(parser, ["--race", "--kv-blocks", "14"])).config.kv_blocks == 14


def test_race_max_num_seqs_beside_lanes_with_a_budget_of_their_own_caps_those():
    """No --kv-memory, lanes with kv_mib=: --max-num-seqs caps those lanes, --slots runs the others."""
    from tui.cli import build_parser, parse, race_spec

    parser = build_parser()
    lanes = ["--lanes", "chunked kv_mib=1", "continuous"]
    spec = race_spec(parser, parse(parser, ["--race", *lanes, "--max-num-seqs", "2", "--slots", "3"]))
    assert (spec.lane_cap, spec.config.max_num_seqs) == (2, 3)


RECORDING = str(Path(__file__).parent / "data" / "preemption-run.jsonl")  # slots 3, 16 blocks of 16, budget 32


def test_race_on_a_recording_starts_every_lane_from_the_recorded_engine_as_whatif_does():
    """--race RUN.jsonl: a lane that says only fcfs re-runs the recorded engine (its small pool, that
    preempts), a lane's own settings and the options typed win, max_len is the recording's."""
    from tui.cli import build_parser, parse, race_spec

    parser = build_parser()
    notes: list[str] = []
    spec = race_spec(parser, parse(parser, ["--race", RECORDING, "--lanes", "fcfs", "fcfs blocks=96"]), notes)
    a, b = spec.lanes
    assert (a.kind, a.slots, a.block_size, a.kv_blocks, a.budget, a.prefix_cache) == ("chunked", 3, 16, 16, 32, True)
    assert (b.kind, b.slots, b.block_size, b.kv_blocks, b.budget) == ("chunked", 3, 16, 96, 32)
    assert spec.config.max_len == 256
    assert notes[0].startswith("as recorded, unless a lane or an option says otherwise: ") and "blocks 16" in notes[0]
    typed = race_spec(
        parser,
        parse(
            parser,
            [
                "--race",
                RECORDING,
                "--lanes",
                "fcfs",
                "fcfs blocks=96",
                "--kv-blocks",
                "64",
                "--slots",
                "2",
                "--max-len",
                "300",
            ],
        ),
    )
    a, b = typed.lanes
    run = typed.config
    assert (a.kv_blocks, a.slots, run.kv_blocks, run.max_num_seqs, run.max_len) == (None, None, 64, 2, 300)
    assert (a.block_size, a.budget, b.kv_blocks) == (16, 32, 96)  # what no option set: still the recording's


def test_a_recordings_request_too_long_for_max_len_is_named(capsys):
    from tui.cli import build_parser, parse, race_spec

    parser = build_parser()
    with pytest.raises(SystemExit):
        race_spec(parser, parse(parser, ["--race", RECORDING, "--max-len", "64"]))
    assert "--race: the request arriving at 0.00 s (#0 in arrival order): prompt is " in capsys.readouterr().err


def test_a_block_size_other_than_the_recordings_keeps_its_pools_memory():
    """`--race RUN.jsonl --block-size 8` (or a lane's block=8) on a run of 16 blocks of 16 took
    16 blocks of 8: half the memory, a different question. The lanes keep the recorded 256 tokens."""
    from tui.cli import build_parser, parse, race_spec

    parser = build_parser()
    notes: list[str] = []
    spec = race_spec(
        parser,
        parse(
            parser, ["--race", RECORDING, "--lanes", "fcfs", "fcfs block=32", "fcfs block=8 blocks=40", "fcfs block=48"]
        ),
        notes,
    )
    a, b, c, d = spec.lanes
    assert (d.block_size, d.kv_blocks) == (48, 6)  # never less memory than recorded
    assert "warning: lane 'fcfs block=48' runs the recorded pool's 256 tokens in 6 blocks of 48 (288 tokens)" in notes
    assert (a.block_size, a.kv_blocks) == (16, 16)  # the recording's own
    assert (b.block_size, b.kv_blocks) == (32, 8)  # 256 tokens in blocks of 32
    assert (c.block_size, c.kv_blocks) == (8, 40)  # its own blocks= win
    assert "warning: lane 'fcfs block=32' runs the recorded pool's 256 tokens in 8 blocks of 32" in notes
    typed = race_spec(parser, parse(parser, ["--race", RECORDING, "--lanes", "fcfs", "priority", "--block-size", "8"]))
    assert [(lane.block_size, lane.kv_blocks) for lane in typed.lanes] == [(None, 32), (None, 32)]
    assert typed.config.block_size == 8


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--host", "0.0.0.0"], "--host applies to --web only"),
        (["--port", "8080"], "--port applies to --web only"),
        (["--web", "--port", "0"], "expected a port number in 1..65535, got 0"),
        (["--web", "--port", "99999"], "expected a port number in 1..65535, got 99999"),
        (["--web", "--race", "nope"], "--race: nope: no such file"),
        (["--web", "--model", "/nowhere"], "--model:"),
    ],
)
def test_web_options_are_checked_in_one_line(argv, message, capsys):
    from tui.cli import serve_if_asked

    with pytest.raises(SystemExit) as e:
        serve_if_asked(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1, err


def test_a_web_port_in_use_is_one_line(capsys):
    import socket

    from tui.cli import serve_if_asked

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit) as e:
            serve_if_asked(["--web", "--port", str(port)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"cannot listen on 127.0.0.1:{port}: Address already in use" in err, err


def test_the_web_sessions_run_the_same_options_without_the_web_ones():
    from tui.cli import serve_if_asked
    from tui.web import is_loopback, session_argv

    assert session_argv(["--web", "--race", "burst", "--host", "0.0.0.0", "--port=9000", "--slots", "4"]) == [
        "--race",
        "burst",
        "--slots",
        "4",
    ]
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
    assert serve_if_asked(["--race"]) is None  # no --web: the app runs in the terminal


# -- the engine process -----------------------------------------------------------------------------
def test_the_race_process_steps_the_lanes_and_stops_cleanly():
    spec = mini_spec(small_work(n=4, cap=8), 2, threads=2)  # not the tests' 1 (conftest): the child must set it
    runner = ChildRunner(spec, paused=True).start(wait=False)
    assert runner.frame.status == "loading" and len(runner.frame.lanes) == 3  # the screen is up at once
    loop = threading.Thread(target=runner.run, daemon=True)
    loop.start()
    try:
        for _ in (1, 2, 3):
            runner.send(StepOnce())  # sent while loading: kept, then applied
        deadline = time.monotonic() + 120
        while runner.frame.turns < 3:
            assert runner.start_error is None and time.monotonic() < deadline, runner.start_error
            time.sleep(0.05)
        assert runner.frame.status == "ready" and runner.device == "cpu" and runner.threads == 2
        assert sum(v.decode_steps for v in runner.frame.lanes) >= 1
    finally:
        runner.stop()
    loop.join(5)
    assert not loop.is_alive() and runner._proc.exitcode is not None


def test_a_race_process_that_cannot_start_says_why_in_one_line():
    spec = mini_spec(small_work(n=2, cap=8), 2, block_size=8, kv_blocks=1, threads=1)
    runner = ChildRunner(spec, paused=True).start(wait=False)
    loop = threading.Thread(target=runner.run, daemon=True)  # returns once the child reports
    loop.start()
    try:
        loop.join(120)
        assert not loop.is_alive(), "the race process neither failed nor reported"
        assert "but the pool has only 1 block (" in str(runner.start_error)
        assert "\n" not in str(runner.start_error)
    finally:
        runner.stop()


async def test_a_what_if_of_a_recording_reaches_the_finish_with_the_per_request_comparison():
    """Three lanes with their own settings on a recording's requests: the finish line shows the
    per-request table (what the comparison says), and [ / ] move the request whose lanes show."""
    from tinyllm.race.spec import parse_lanes
    from tinyllm.race.whatif import compare, requests_from_recording

    arrivals, _ = requests_from_recording(Path(__file__).parent / "data" / "preemption-run.jsonl")
    work = tuple((t, tuple(r.prompt), min(r.max_new_tokens, 12), r.priority, r.tenant) for t, r in arrivals)
    app = race_app(work, lanes=parse_lanes(["fcfs", "shortest-first", "budget=16 blocks=40"]))
    async with app.run_test(size=(160, 60)) as pilot:
        await step_to(pilot, 10_000)
        frame = app.runner.frame
        assert frame.done
        finish = app.screen.query_one(FinishLine)
        assert finish.display and finish.comparing
        text = plain(app, finish)
        rows = compare(frame.lanes)
        assert "per request, most changed first" in text and "A = fcfs" in text and "C = budget=16 blocks=40" in text
        first = rows[0]
        line = next(ln for ln in text.splitlines() if ln.split()[:1] == [str(first.rid)])
        assert f"{first.change:+.0%}" in line
        assert f"#{first.rid} across the lanes" in text
        await pilot.press("right_square_bracket")
        assert f"#{rows[1].rid} across the lanes" in plain(app, finish)
        for width in range(50, 170, 7):  # where titles and the request's legend wrap: lane C was cut off
            await pilot.resize_terminal(width, 60)
            await pilot.pause()
            options = app.console.options.update_width(finish.size.width)
            drawn = app.console.render_lines(finish.render(), options, pad=False)
            assert finish.size.height >= len(drawn), (width, finish.size.height, len(drawn))
            text = "\n".join("".join(seg.text for seg in line) for line in drawn)
            assert "┄ preempted" in text, (width, text[-600:])  # the chart's legend whole (it was cropped)
        assert not app.notified


# -- equal KV memory (issue 22) ------------------------------------------------------------------------
async def test_at_equal_kv_memory_each_lane_shows_its_sequences_and_memory():
    """--kv-memory: static batching and the slot lane get the rows it buys (2 of MAX_LEN here), the
    paged lane its blocks, run by up to 32 sequences (the token budget); each panel and the finish
    line say so (80x24: the panels' titles; the table where it has room), and a short screen
    summarises the paged lane's many rows in two lines."""
    import torch

    from tinyllm.engine import kv_bytes_per_token
    from tinyllm.engine.build import MIB

    model, _ = bundled()
    budget = 2 * MAX_LEN * kv_bytes_per_token(model, torch.device("cpu")) / MIB  # 3 MiB: two rows
    app = race_app(small_work(n=6, cap=8), kv_memory_mib=budget)
    r = app.runner
    async with app.run_test(size=(80, 24)) as pilot:
        await step_to(pilot, 3)
        assert [(v.seqs, v.kv_mib) for v in r.frame.lanes] == [(2, 3.0), (2, 3.0), (BUDGET, 3.0)]
        panels = {v.key: app.screen.query_one(f"#lane-{v.key}", LanePanel) for v in r.frame.lanes}
        assert panels["static"].border_title == "static batching · 2 seqs · 3 MiB"
        assert panels["chunked"].border_title == f"token budget + prefix cache · {BUDGET} seqs · 3 MiB"
        grid = panels["chunked"]._grid(panels["chunked"].content_region.width)
        assert len(grid) == 2 and "+" in grid[-1].plain  # 32 rows in two lines
        await step_to(pilot, 10_000)
        await pilot.resize_terminal(120, 40)
        await until(pilot, lambda: app.screen.query_one(FinishLine).size.width >= 100, what="the resize")
        table = plain(app, app.screen.query_one(FinishLine))
        assert "seqs · KV" in table
        assert next(ln for ln in table.splitlines() if ln.split()[:1] == ["budget+cache"]).count(f"{BUDGET} · 3 MiB")
        assert not app.notified


@pytest.mark.parametrize(
    "lanes", [("fcfs", "chunked"), ("static", "static slots=4"), ("priority", "chunked"), ("chunked", "fcfs budget=64")]
)
def test_a_lane_named_by_its_kind_beside_one_with_settings_loads_and_races(lanes):
    """`--race --lanes fcfs chunked` died before the screen came up (KeyError: 'lane1'): the loading
    frame looked up a title for the lanes' keys, which are lane0, lane1 once one lane has settings.
    The loading frame and the race's own frame now name each lane alike."""
    from tui.cli import build_parser, parse, race_spec

    parser = build_parser()
    spec = race_spec(parser, parse(parser, ["--race", "--lanes", *lanes]))
    loading = spec.loading_frame()
    model, _ = bundled()
    race = spec.make_race(model)
    assert [v.title for v in loading.lanes] == [lane.title for lane in race.lanes]
    named = {"static": "static batching", "chunked": "token budget + prefix cache"}
    assert [v.title for v in loading.lanes] == [named.get(label, label) for label in lanes]


def test_a_budget_too_small_for_the_lanes_says_so_before_the_race_starts():
    """Whether a budget holds one request depends on the model: the race (in the engine process)
    refuses it with the engine's words, naming the option; the app prints that one line."""
    model, _ = bundled()
    spec = mini_spec(small_work(n=2, cap=8), 2, kv_memory_mib=0.5)
    with pytest.raises(
        ValueError,
        match=r"lane 'static': --kv-memory 0.5 MiB is too small for one request: a row "
        r"reserves --max-len 256 tokens x 6,144 bytes = 1.50 MiB",
    ):
        spec.make_race(model)
    frame = spec.loading_frame()  # loading: rows not known yet
    assert [len(v.rows) for v in frame.lanes] == [0, 0, 0] and "0.5 MiB of KV memory" in frame.lanes[0].detail


@pytest.mark.parametrize("cap, kv_dtype", [(None, "auto"), (24, "bfloat16")])
async def test_r_in_an_app_started_at_a_kv_budget_races_every_lane_at_that_budget(cap, kv_dtype):
    import torch

    from tinyllm.engine import ContinuousEngine

    model, tok = bundled()
    eng = ContinuousEngine(
        model,
        None,
        128,
        kv="paged",
        block_size=8,
        kv_memory_mib=6.0,
        chunked_prefill=True,
        max_num_seqs=cap,
        generator=torch.Generator().manual_seed(0),
        kv_cache_dtype=kv_dtype,
    )
    app = watched_app(eng, tok, 12)
    async with app.run_test(size=(120, 40)) as pilot:
        app.query_one("#requests").focus()
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, RaceScreen))
        race = app.screen.runner
        # the race's context is 512: 6 MiB buys 2 rows of 512 x 6,144 bytes (4 of 3,072 at the app's
        # bfloat16); the paged lane its blocks
        rows = 2 if kv_dtype == "auto" else 4
        assert [(v.seqs, v.kv_mib) for v in race.frame.lanes] == [(rows, 6.0), (rows, 6.0), (cap or 64, 6.0)]
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, RaceScreen))


async def test_a_lane_grows_with_its_lines_at_80x24():
    """A lane's panel takes the lines its frame needs, frame after frame: one that gains a line
    (a note of what it waits for, more busy rows than a line of cells) grows, so its progress bar
    and figures stay on screen (its height once stayed what an earlier frame gave it, and the bar
    was cut off), and one that loses it shrinks back."""
    from dataclasses import replace

    app = race_app(small_work(n=40, cap=24), slots=4, kv_memory_mib=6.0)
    async with app.run_test(size=(80, 24)) as pilot:
        panel = pilot.app.screen.query_one("#lane-chunked", LanePanel)
        await step_to(pilot, 3)
        screen = pilot.app.screen
        await until(pilot, lambda: screen._shown == pilot.app.runner.frame.seq, what="step 3 drawn")
        # these frames only: the race's own redraw (a frame it published late, on a loaded
        # machine) once replaced the noted view and the panel rightly shrank
        screen.refresh_from_runner = lambda force=False: None
        plain = panel.view
        noted = replace(plain, note="waits for a full batch: 2/8")
        heights = []

        def laid_out() -> bool:
            return panel.content_region.height == len(panel.lines(panel.content_region.width))

        for view in (plain, noted, plain, noted):  # frames in turn, nothing else redrawn
            panel.show(view, compact=True)
            await until(pilot, lambda: panel.view is view and laid_out(), what="the panel's new height")
            want = panel.lines(panel.content_region.width)
            assert "done" in "".join(str(line) for line in want)  # the progress bar is there
            heights.append(panel.content_region.height)
        assert heights[1] == heights[0] + 1 == heights[3] and heights[2] == heights[0]


async def test_at_the_finish_the_chart_shows_only_where_the_finish_table_leaves_it_room():
    """At 80x24 the app's race kept its chart at the finish (its room was reckoned before the finish
    table had a height: the finish frame, drawn once, left a screen that scrolled, the legend cut
    off; seen in tmux, where frames come from the race's process). Here, one slot a lane: the
    chart fits beside the lanes mid-race, not beside the lanes and the finish table, and the
    finished screen does not scroll."""
    app = race_app(small_work(n=3, cap=12), slots=1)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = pilot.app.screen
        await step_to(pilot, 4)
        await until(pilot, lambda: screen.query_one("#track").display, what="the chart mid-race: room for it")
        await step_to(pilot, 10_000)  # to the finish; no redraw forced after it
        await until(pilot, lambda: screen.query_one("#finish", FinishLine).lanes, what="the finish table")
        await until(pilot, lambda: not screen.query_one("#track").display, what="the chart gone at the finish")
        assert screen.max_scroll_y == 0, "the finished race scrolls"
        legend = screen.query_one("#race-legend")
        assert legend.region.height and legend.region.bottom <= screen.size.height - 1  # above the footer
        used = sum(screen.query_one(q).outer_size.height for q in ("#race-status", "#lanes", "#finish", "#race-legend"))
        assert not screen.query_one("#track").display and 24 - 1 - used < RaceTrack.height_for(3)


async def test_the_finish_tables_scroll_by_keys_and_the_screen_says_there_is_more_below():
    """They scrolled only with the mouse, and nothing said the table went on below the edge."""
    from tinyllm.race.spec import parse_lanes

    app = race_app(small_work(n=6, cap=6), lanes=parse_lanes(["fcfs", "shortest-first", "budget=16"]))
    async with app.run_test(size=(100, 24)) as pilot:
        await step_to(pilot, 10_000)
        screen = app.screen
        status = lambda: screen.query_one("#race-status").render().plain  # noqa: E731
        await until(pilot, lambda: screen.max_scroll_y > 0 and "more below" in status(), what="the hint")
        await pilot.press("pagedown")
        await until(pilot, lambda: screen.scroll_y > 0, what="PgDn to scroll")
        await pilot.press("end")
        await until(pilot, lambda: screen.scroll_y == screen.max_scroll_y, what="End to scroll to the end")
        await until(pilot, lambda: "more below" not in status(), what="the hint to go")
        await pilot.press("home")
        await until(pilot, lambda: screen.scroll_y == 0 and "more below" in status(), what="Home")
        await pilot.press("down")
        await until(pilot, lambda: screen.scroll_y == 1, what="↓ one line")
        assert not app.notified


def test_the_cost_clock_is_named_with_its_profile():
    from tinyllm.race.cost import CostModel
    from tui.runners.race import clock_name

    class Clock:
        kind, cost = "cost", CostModel(1e-3, 1e-5, 1e-6, 1e-9, source="reference profile: the bundled model")

    assert clock_name(Clock()) == "the cost clock, reference profile: the bundled model"


async def test_the_finish_line_names_unequal_kv_memory_where_the_verdict_is():
    """From the app with --kv-blocks 48: the slot lanes 24 MiB, the budget lane 4.5 MiB; it lost
    with 15 preemptions and nothing on screen said why."""
    from tinyllm.race.spec import parse_lanes

    app = race_app(small_work(n=4, cap=4), lanes=parse_lanes(["static kv_mib=6", "chunked kv_mib=2"]))
    async with app.run_test(size=(160, 40)) as pilot:
        await step_to(pilot, 10_000)
        text = " ".join(plain(app, app.screen.query_one(FinishLine)).split())
        assert "the lanes hold unequal KV memory (static kv_mib=6 6 MiB, chunked kv_mib=2 1.97 MiB)" in text, text
        assert "--kv-memory MiB races them at equal memory" in text
    equal = race_app(small_work(n=4, cap=4), lanes=parse_lanes(["static kv_mib=6", "chunked kv_mib=6"]))
    async with equal.run_test(size=(160, 40)) as pilot:
        await step_to(pilot, 10_000)
        assert "unequal" not in plain(equal, equal.screen.query_one(FinishLine))
