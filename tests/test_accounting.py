"""Per-request accounting (queue / prefill / decode / total, preemptions, cached tokens): one
definition (tinyllm/observe/accounting.py) for the server's ``"tinyllm"`` field and the app's
request pane; the admission time it needs travels in RequestView through recordings, and old
recordings without it still replay. The server side is tested in tests/test_chat.py."""

from __future__ import annotations

from pathlib import Path

from tests.test_app import make_app, submit_and_step
from tests.test_recording import ev
from tinyllm.engine import Sampling
from tinyllm.observe.accounting import Accounting, RequestTimes
from tinyllm.observe.recording import SnapshotDecoder, read_recording
from tinyllm.observe.snapshot import RequestView
from tui.widgets.request_pane import RequestPane, accounting_text

OLD_RECORDING = Path(__file__).parent / "data" / "preemption-run.jsonl"


def view(**kw) -> RequestView:
    base = dict(
        rid=3,
        state="finished",
        slot=None,
        prompt=(1, 2),
        tokens=(5, 6, 7),
        max_new_tokens=3,
        sampling=Sampling(),
        eos_id=None,
        arrival_s=1.0,
        first_token_s=1.75,
        finish_s=3.0,
        preemptions=1,
        cached_tokens=16,
        admitted_s=1.5,
    )
    return RequestView(**{**base, **kw})


def test_phases_follow_the_lifecycle_events():
    times = RequestTimes()
    for e in (
        ev("queued", 0, 0, t=1.0),
        ev("admitted", 0, 1, t=1.5, cached=16),
        ev("first_token", 0, 1, t=1.75),
        ev("preempted", 0, 2, t=2.0),
        ev("admitted", 0, 3, t=2.5, cached=32),
        ev("finished", 0, 4, t=3.0),
    ):
        times.on_event(e)
    assert times.accounting() == Accounting(500.0, 250.0, 1250.0, 2000.0, 1, 16)  # the first admission counts
    assert Accounting.of_view(view(), 99.0) == times.accounting()  # the pane's view: the same


def test_running_and_queued_views_count_up_to_now():
    assert Accounting.of_view(
        view(state="queued", admitted_s=None, first_token_s=None, finish_s=None, preemptions=0, cached_tokens=0), 1.25
    ) == Accounting(250.0, None, None, 250.0, 0, 0)
    running = Accounting.of_view(view(state="running", finish_s=None), 2.0)
    assert (running.queue_ms, running.prefill_ms, running.decode_ms) == (500.0, 250.0, 250.0)


def test_pane_text_shows_each_phase_once_it_ended():
    assert accounting_text(view(state="queued", admitted_s=None, first_token_s=None, finish_s=None)) is None
    prefilling = accounting_text(view(state="running", first_token_s=None, finish_s=None)).plain
    assert "queue 500ms" in prefilling and "prefill" not in prefilling and "decode" not in prefilling
    done = accounting_text(view()).plain
    assert "queue 500ms · prefill 250ms · decode 1.25s · total 2.00s · preempted 1× · 16 cached" in done


def test_old_recordings_without_admission_times_still_replay():
    header, records, _ = read_recording(OLD_RECORDING)
    dec = SnapshotDecoder(header)
    for _, rec in records[:40]:
        snap = dec.apply(rec["snap"])
    assert snap.requests and all(v.admitted_s is None for v in snap.requests)
    assert all(accounting_text(v) is None for v in snap.requests)  # nothing made up


async def test_the_pane_shows_a_finished_requests_accounting():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        v = await submit_and_step(pilot, "ROMEO:\n", 30)
        assert v.state == "finished" and v.admitted_s is not None and v.admitted_s >= v.arrival_s
        body = app.query_one(RequestPane).query_one("#pane-body").render()
        text = str(getattr(body, "plain", body))
        want = accounting_text(v, app.query_one(RequestPane).accounting_width()).plain.strip()
        assert want.startswith("── queue") and "total" in want and want in text
        assert app.query_one(RequestPane).body_text == "ROMEO:\n" + app.runner.frame.texts[v.rid]  # text only
