"""Nothing cut at 80x24, 120x36 or 200x50, and the run's history kept for scrolling back (issue 44,
items 5 and 7).

Each field of the status line, the counters and the footer is whole or gone, never cut mid-word
(at 80x24 `preempt 1…` hid the count, the footer ended at `f5▏`; at 120x36 `prefix hit 12% step …`
never showed the step time); toasts stand above the prompt editor and the replay's scrubber; the
vLLM prefix-cache panel's title and header fit at 120 columns. The event log keeps its last
HISTORY entries (more than a frame carries) and the timeline every request's row, and both scroll
back with keys. Every wait is for an event (a frame, a count), never for time.
"""

from __future__ import annotations

import pytest
from rich.cells import cell_len
from textual.css.query import NoMatches
from textual.widgets._footer import FooterKey

from tests.test_app import _watch, has_work, make_app, no_unexpected_errors, step, until  # noqa: F401
from tests.test_app_replay import replay_app
from tests.test_attach_vllm import fake  # noqa: F401  (a fake vLLM server)
from tests.test_kv_events import pub  # noqa: F401  (a KV-events publisher)
from tinyllm.workload import bundled_workloads
from tui.app import TinyLLMApp
from tui.runners.interface import AbortAll, SetPaused, Submit
from tui.widgets.event_log import HISTORY, EventLog
from tui.widgets.footer import FittedFooter
from tui.widgets.kv_panel import KVPanel
from tui.widgets.prompt_editor import HINTS, PromptEditor, placeholder
from tui.widgets.timeline import ROWS_KEPT, TimelinePanel

SIZES = [(80, 24), (120, 36), (200, 50)]


def screen_lines(app) -> list[str]:
    """The screen as the terminal shows it, one string per row (toasts and dialogs included)."""
    return ["".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips()]


def busy_app(**kw) -> TinyLLMApp:
    """The burst workload on a tight paged pool with chunked prefill (so prefix caching): ten and
    more requests finish, some are preempted, the prefix cache is queried."""
    return make_app(
        kv="paged", slots=8, max_len=256, kv_blocks=24, budget=64, prompts_file=bundled_workloads()["burst"], **kw
    )


async def run_until(pilot, cond, what: str) -> None:
    """Let the engine run until ``cond(frame)``, then pause it there."""
    app = pilot.app
    await until(pilot, lambda: len(app.runner.frame.snapshot.requests) > 0, what="the workload")
    app.runner.send(SetPaused(False))
    await until(pilot, lambda: cond(app.runner.frame), what=what, timeout=120)
    app.runner.send(SetPaused(True))
    await until(pilot, lambda: app.runner.frame.paused, what="the pause")
    await until(pilot, lambda: app._shown_seq == app.runner.frame.seq, what="the last frame drawn")


def footer_ready(app, first: str) -> bool:
    """Whether the footer shows ``first`` first, laid out (it recomposes after focus moves)."""
    try:
        return footer_fits(app)[0] == first
    except (AssertionError, IndexError, NoMatches):  # (NoMatches: the footer is mid-recompose)
        return False


def footer_fits(app) -> list[str]:
    """The footer's keys, each whole on the screen's last row, none under the palette's key."""
    footer = app.screen.query_one(FittedFooter)
    keys = [k for k in footer.query(FooterKey) if not k.has_class("-command-palette")]
    palette = footer.query_one(".-command-palette", FooterKey)
    last = screen_lines(app)[-1]
    shown = [f"{k.key_display} {k.description}" for k in keys]
    assert keys and max(k.region.right for k in keys) <= palette.region.x, (shown, last)
    assert all(f" {text} " in last for text in shown), (shown, last)
    assert last.rstrip().endswith("^p palette"), last
    return shown


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_status_counters_hint_and_footer_fit_whole(size):
    app = busy_app()
    async with app.run_test(size=size) as pilot:
        await run_until(
            pilot,
            lambda f: (
                f.snapshot.counters.finished >= 10
                and f.snapshot.counters.preemptions >= 1
                and f.snapshot.counters.prefix_queries > 0
            ),
            what="ten finished, a preemption, the prefix cache queried",
        )
        lines = screen_lines(app)
        assert "…" not in lines[0] and lines[0].startswith(" ⏸ PAUSED  step "), lines[0]

        panel = app.query_one(KVPanel)
        f, c = panel.frame, panel.frame.snapshot.counters
        text = panel.render().plain.splitlines()
        width = panel.content_region.width
        for line in text:
            assert cell_len(line.rstrip()) <= width and "…" not in line, (line, width)
        counters = next(line for line in text if line.startswith(("queue", "queued")))
        wide = counters.startswith("queued")
        for label, short, n in (
            ("queued", "queue", f.snapshot.num_requests_waiting),
            ("running", "run", f.snapshot.num_requests_running),
            ("finished", "done", c.finished),
            ("preempted", "preempt", c.preemptions),  # not zero: before those that are
        ):
            assert f"{label if wide else short} {n} " in counters + " ", (counters, label, n)
        if size != (80, 24):  # (80x24 gives the step time way first, by design: the last of its figures)
            figures = next(line for line in text if "tok/s" in line)
            assert f"step {f.step_ms:.1f}ms" in figures and "prefix hit" in figures, figures  # (a local engine's)
            assert any("latency p50/p95" in line for line in text)

        await until(pilot, lambda: footer_ready(app, "i Type a prompt"), what="the list's footer")
        shown = footer_fits(app)
        assert "f1 Help" in shown and "^c Quit" in shown

        await pilot.press("i")  # the editor: its hint fits whole too, and its keys lead the footer
        await until(pilot, lambda: footer_ready(app, "⏎ Send"), what="the editor's footer")
        shown = footer_fits(app)
        assert shown[:3] == ["⏎ Send", "^j New line", "esc Leave the prompt"], shown
        editor = app.query_one(PromptEditor)
        hint = editor.placeholder
        assert hint == placeholder(editor.content_size.width) and cell_len(hint) <= editor.content_size.width
        assert set(hint.split(" · ")) <= {text for text, _ in HINTS}, hint  # whole parts only
        assert hint.startswith("Type a prompt · Enter sends") and hint in screen_lines(app)[-2]
        if size[0] >= 120:
            assert hint == " · ".join(text for text, _ in HINTS)


async def test_the_footer_drops_whole_keys_as_the_terminal_narrows():
    """The same app at 200, 120 and 80 columns: fewer keys, most useful first, each whole."""
    app = make_app()
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.press("escape")  # to the list
        await until(pilot, lambda: footer_ready(app, "i Type a prompt"), what="the list's footer")
        counts = []
        for width in (200, 120, 80, 60):
            await pilot.resize_terminal(width, 30)
            footer = app.screen.query_one(FittedFooter)
            await until(
                pilot,
                lambda w=width: footer._fitted_width == w and footer_ready(app, "i Type a prompt"),
                what=f"the footer at {width} columns",
            )
            counts.append(len(footer_fits(app)))
        assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1] >= 2, counts


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_toasts_stand_above_the_prompt_editor_however_tall(size):
    app = make_app()
    async with app.run_test(size=size, notifications=True) as pilot:
        await until(pilot, lambda: isinstance(app.focused, PromptEditor))
        entry, footer = app.query_one("#entry"), app.screen.query_one(FittedFooter)
        for n, lines in enumerate((1, 3), start=1):
            if lines > 1:
                await pilot.press(*"ROMEO:", "ctrl+j", *"What", "ctrl+j", *"light")
                await until(pilot, lambda: entry.region.height == 3, what="the editor to grow")
            app.notify(f"a toast over {lines} line(s) " * 4, timeout=30)
            await until(
                pilot,
                lambda: (
                    len(app.screen.query("Toast")) == n
                    and all(t.region.bottom <= entry.region.y for t in app.screen.query("Toast"))
                ),
                what="the toasts above the editor",
            )
            for toast in app.screen.query("Toast"):
                assert not toast.region.overlaps(entry.region) and not toast.region.overlaps(footer.region)
        assert "T=" in screen_lines(app)[entry.region.y]  # the next request's settings: in view


async def test_toasts_stand_above_the_replay_scrubber():
    app = replay_app()
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        app.notify("a toast in a replay " * 4, timeout=30)
        await until(pilot, lambda: len(app.screen.query("Toast")) == 1, what="the toast")
        await pilot.pause()
        scrubber, toast = app.query_one("#scrubber"), app.screen.query_one("Toast")
        assert not toast.region.overlaps(scrubber.region) and toast.region.bottom <= scrubber.region.y
        assert "? keys" in screen_lines(app)[scrubber.region.y]


# -- live scrollback -----------------------------------------------------------------------------------
async def test_the_event_log_scrolls_back_past_what_a_frame_carries(monkeypatch):
    """Frames carry the newest 30 entries here (500 in the app): the log keeps them all, the keys
    scroll back to the run's first entry, and a view scrolled back stays put while new entries
    arrive. (Stepped one step at a time, each drawn: no entry falls between two frames.)"""
    monkeypatch.setattr("tui.runners.engine.LOG_LINES", 30)
    app = busy_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: len(app.runner.frame.snapshot.requests) > 0, what="the workload")
        while len(app.runner.frame.log) < 30 or app.runner.frame.log[0].seq == 1:
            assert has_work(app.runner.frame), "the run should make more entries than a frame holds"
            await step(pilot)
        log = app.query_one(EventLog)
        seqs = [e.seq for e in log.lines]
        assert seqs == list(range(1, len(seqs) + 1)) and seqs[-1] == app.runner.frame.log[-1].seq
        assert len(seqs) > len(app.runner.frame.log) == 30, "the log should keep more than a frame"
        first = log.lines[0]
        assert log.visible()[-1] == log.lines[-1]  # following the newest
        assert first not in log.visible()
        await pilot.press("e")  # to the log
        await until(pilot, lambda: app.focused is log)
        await pilot.press("pageup")
        await until(pilot, lambda: log.below > 0)
        assert log.visible()[-1] != log.lines[-1] and "newer · End: follow" in log.border_subtitle
        await pilot.press("home")
        await until(pilot, lambda: log.visible()[0] == first, what="the first entry in the view")
        drawn = f"{first.step:>6} {first.text[:20]}"
        await until(pilot, lambda: any(drawn in line for line in screen_lines(app)), what="it on the screen")
        shown = log.visible()
        await pilot.press("space", "space")  # paused, resumed: two new entries
        n = len(log.lines)
        await pilot.press("space")
        await until(pilot, lambda: len(log.lines) > n, what="new entries")
        assert log.visible() == shown, "a view scrolled back should stay on its entries"
        await pilot.press("end")
        await until(pilot, lambda: log.below == 0 and log.visible()[-1] == log.lines[-1])
        assert log.border_subtitle == ""
    assert HISTORY == 10_000 and log.lines.maxlen == HISTORY


def row(timeline: TimelinePanel, rid: int) -> str | None:
    """The chart's cells on request ``rid``'s row, or None when its row is not on screen."""
    for line in timeline.render().plain.splitlines():
        label, _, cells = line.lstrip().partition(" ")
        if label == f"#{rid}":
            return cells
    return None


async def test_events_a_frame_could_not_carry_are_said_missing(monkeypatch):
    """More new entries in one frame than it carries (an abort of 30 queued requests, frames of 20
    here): the log says how many it never got, after what it kept."""
    monkeypatch.setattr("tui.runners.engine.LOG_LINES", 20)
    app = make_app(slots=2, new=4)
    async with app.run_test(size=(120, 40)) as pilot:
        s = app.settings
        for i in range(30):
            app.runner.send(Submit(f"ROMEO {i}:", s, tuple(app.tokenizer.encode(f"ROMEO {i}:"))))
        await until(pilot, lambda: len(app.runner.frame.snapshot.requests) == 30, what="30 queued")
        log = app.query_one(EventLog)
        await until(pilot, lambda: log.lines and log.lines[-1] == app.runner.frame.log[-1], what="drawn")
        before = log.lines[-1]
        app.runner.send(AbortAll())  # an entry per request, in one frame
        await until(pilot, lambda: all(r.state == "aborted" for r in app.runner.frame.snapshot.requests))
        await until(pilot, lambda: log.lines[-1] == app.runner.frame.log[-1], what="the frame's entries")
        kept = list(log.lines)
        note = kept[kept.index(before) + 1]  # (the submissions may have made one too: not this test's)
        missed = app.runner.frame.log[0].seq - before.seq - 1
        assert missed > 0 and note.text.startswith(f"… {missed:,} events came between two frames"), note
        assert kept[kept.index(note) + 1 :] == list(app.runner.frame.log)


async def test_the_timeline_scrolls_back_to_the_first_step_and_the_first_request():
    app = busy_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await run_until(
            pilot,
            lambda f: not f.pending_arrivals and all(r.state == "finished" for r in f.snapshot.requests),
            what="the end",
        )
        now = app.runner.frame.snapshot.counters.steps
        await pilot.press("t")
        timeline = app.query_one(TimelinePanel)
        await until(pilot, lambda: app.focused is timeline and timeline.tracks)
        first, last = timeline._window(timeline.size.width)[1:]
        assert first > 0 and last == now, "the run should be longer than the chart is wide"
        assert row(timeline, 0) is None, "the first request's row should be off screen"
        await pilot.press("home")  # the first request: the rows scroll to it
        await until(pilot, lambda: row(timeline, 0) is not None, what="#0's row")
        for _ in range(200):
            if timeline._window(timeline.size.width)[1] <= 0:
                break
            await pilot.press("left")
        await until(pilot, lambda: timeline._window(timeline.size.width)[1] <= 0, what="step 0 in view")
        chart = timeline.render().plain
        assert chart.startswith("steps 0–") and f"now {now}: →" in chart, chart.splitlines()[0]
        assert row(timeline, 0).strip(), "#0's life (its first steps) should be drawn"
        window = timeline._window(timeline.size.width)
        app.runner.send(Submit("ROMEO:", app.settings, tuple(app.tokenizer.encode("ROMEO:"))))
        await until(pilot, lambda: has_work(app.runner.frame), what="a new request")
        await step(pilot, 3)  # the run goes on: the chart stays on the steps scrolled back to
        await until(pilot, lambda: timeline.now_step == now + 3, what="three more steps drawn")
        assert timeline._window(timeline.size.width) == window and f"now {now + 3}: →" in timeline.render().plain
        await pilot.press("right")
        while timeline.pinned is not None:
            await pilot.press("right")
        last = timeline._window(timeline.size.width)[2]
        assert last == now + 3 and "now " not in timeline.render().plain.splitlines()[0]
    assert ROWS_KEPT == 10_000


async def test_e_says_where_the_log_is_when_the_screen_hides_it():
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("escape", "e")
        await until(pilot, lambda: any("event log is hidden" in msg for _, _, msg in app.notified))


async def test_the_prefix_cache_panel_title_and_header_fit_at_120_columns(fake, pub):
    from tests.test_kv_events import stored
    from tui.cli import build_app
    from tui.widgets.prefix_cache_map import PrefixCacheMap

    app = build_app(["--attach", fake.url, "--kv-events", pub.endpoint, "--max-new-tokens", "10"])
    _watch(app)
    async with app.run_test(size=(120, 36)) as pilot:
        panel = app.query_one("#prefix", PrefixCacheMap)
        pub.wait_subscribed()
        await until(pilot, lambda: app.runner.frame.kv_cache.status.startswith("connected"), what="a connection")
        pub.send(stored([1, 2, 3], None))
        pub.send(stored([4], 3), stored([5], 3))
        await until(pilot, lambda: app.runner.frame.kv_cache.batches == 2, what="the events in a frame")
        await until(pilot, lambda: panel.view == app.runner.frame.kv_cache and panel.border_title)
        await pilot.pause()
        title = str(panel.border_title)
        assert title.startswith("vLLM prefix cache") and any(title in line for line in screen_lines(app)), title
        width = panel.content_region.width
        text = panel.render().plain.splitlines()
        for line in text:
            assert cell_len(line) <= width and "…" not in line.replace("… prefix gone", ""), (line, width)
        assert text[0].startswith("5 blocks × 16 · 80 tok") and "▣ 1 shared" in text[0], text[0]
        assert "■ block" in "\n".join(text) and "… prefix gone" in "\n".join(text)  # the legend, wrapped


@pytest.mark.parametrize("width", [24, 38, 56, 80])
def test_a_requests_accounting_breaks_between_its_figures_never_inside_one(width):
    """`── queue 980ms · … · total` then `2.37s` on the next line read as two figures: a line breaks
    only at a separator, each line within the pane."""
    from tests.test_accounting import view
    from tui.widgets.request_pane import accounting_text

    one = accounting_text(view()).plain
    broken = accounting_text(view(), width).plain
    assert broken.replace(" ·\n   ", " · ") == one
    assert all(cell_len(line) <= width for line in broken.splitlines()), broken


async def test_the_help_states_how_much_history_is_kept():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f1")
        await until(pilot, lambda: len(app.screen_stack) > 1)
        rows = dict(app.screen.rows())
        assert rows["e"] == f"Events: scroll back (the last {HISTORY:,})"
        assert "← / → (timeline)" in rows and f"the last {HISTORY:,} events" in " ".join(rows.values())
        how = app.screen.how_to_read[1]
        assert f"last {HISTORY:,} events in memory" in " ".join(how.split())
        assert f"newest {ROWS_KEPT:,} requests" in " ".join(how.split())


def test_the_helps_words_are_paragraphs_the_box_wraps():
    """The source keeps to 100 columns with two-space continuation lines; shown as written, a
    narrower help box wrapped each line again ('…Ctrl+J starts a new line, ↑' / 'in an empty
    editor brings back' / 'the prompts sent before.')."""
    from tui.screens.modals import HOW_TO_READ, paragraphs

    text = paragraphs("Keys: one\n  two\nThe same: three\n")
    assert text.plain == "Keys: one two\nThe same: three"
    assert [text.plain[s.start : s.end] for s in text.spans] == ["Keys: ", "The same: "]  # labels bold
    shown = paragraphs(HOW_TO_READ).plain.splitlines()
    assert shown[0].startswith("Keys: the app starts") and "Ctrl+J starts a new line, ↑ in an empty editor" in shown[0]
    assert len(shown) == sum(not line.startswith("  ") for line in HOW_TO_READ.splitlines())


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_the_settings_and_load_dialogs_fit_whole(size):
    """At 80x24 the settings' buttons lost their bottom edge (the box was taller than the screen),
    and the load dialog's hint was cut mid-sentence."""
    from textual.widgets import Button, Input

    from tui.screens.picker import PromptPicker
    from tui.screens.settings import SettingsScreen

    app = make_app("paged", slots=8, kv_blocks=32, budget=256)  # the engine's line takes three rows at 80x24
    async with app.run_test(size=size) as pilot:
        await pilot.press("escape", "f2")
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen), what="the settings")
        box = app.screen.query_one("#settings-box").content_region
        for button in app.screen.query(Button):
            assert box.contains_region(button.region), (button.id, button.region, box)
        await pilot.press("escape", "f3")
        await until(pilot, lambda: isinstance(app.screen, PromptPicker), what="the load dialog")
        path = app.screen.query_one("#picker-path", Input)
        assert len(path.placeholder) <= path.content_region.width, path.placeholder
