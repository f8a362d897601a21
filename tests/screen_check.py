"""One check that every panel of the app shows the frame it was last drawn from, no more.

Used after every frame of a replay played back and forth, of an attach through a server
restart, after resizes and once a run is idle: each panel's rows are compared with the
snapshot, so a panel that keeps a row the snapshot lost (or misses one it gained) fails."""

from __future__ import annotations

from tui.app import TinyLLMApp
from tui.runners.interface import Frame
from tui.widgets.block_map import BlockMap
from tui.widgets.event_log import EventLog
from tui.widgets.kv_panel import KVPanel
from tui.widgets.request_list import RequestList
from tui.widgets.request_pane import RequestPane
from tui.widgets.slot_grid import SlotGrid
from tui.widgets.style import dtype_short, dtype_tag
from tui.widgets.timeline import TimelinePanel


def drawn_frame(app: TinyLLMApp) -> Frame:
    """The frame every panel has drawn (the app says which; the check holds it to that)."""
    frame = app._details_frame
    assert frame is not None and app._shown_seq == frame.seq, "a frame is drawn only in part"
    return frame


def check_panels(app: TinyLLMApp, frame: Frame | None = None) -> Frame:
    """Assert each panel shows ``frame`` (default: the one the app says it drew), row by row."""
    frame = frame or drawn_frame(app)
    snap = frame.snapshot
    steps = snap.counters.steps
    status = app.query_one("#status").text.plain
    assert app.metrics_only or f"step {steps}" in status, f"status {status!r} is not at step {steps}"

    if not app.metrics_only:
        grid = app.query_one(SlotGrid)
        assert grid.snapshot == snap, "the slot grid shows another snapshot"
        want = (
            f"Slots ({snap.n_slots}, up to {snap.max_len} tokens each)"
            if snap.kv.kind == "paged"
            else f"Slots ({snap.n_slots} × {snap.max_len} tokens)"
        )
        assert grid.border_title == want, grid.border_title
        text, shown = grid.render().plain, grid.shown()
        for sv in snap.slots[:shown]:
            if sv.rid is not None:
                assert f"#{sv.rid}" in text, f"slot {sv.slot} holds #{sv.rid}, the grid does not say so"
        hidden = snap.slots[shown:]  # a panel too short: its last row counts them
        if hidden:
            held = sum(sv.rid is not None for sv in hidden)
            last = text.rsplit("\n", 1)[-1]
            assert last.startswith(f"+{len(hidden)} more slot{'s' if len(hidden) != 1 else ''}: {held} held"), last
            assert len(last) <= grid.size.width, last
        kv = app.query_one(KVPanel)
        assert kv.frame is not None and kv.frame.snapshot == snap, "the KV panel shows another snapshot"
        if app.has_class("-short"):  # 80x24: the one bar names a dtype other than float32
            tag = dtype_tag(snap.kv)
            assert not tag or kv.render().plain.split("\n", 1)[0].endswith(f" tok {tag}")
        else:
            mib_line = kv.render().plain.split("\n", 1)[0]
            assert f"{snap.kv.mib(snap.kv.reserved_tokens):.1f} MiB used / claimed / reserved" in mib_line, mib_line
            assert not snap.kv.dtype or mib_line.endswith(f" · {dtype_short(snap.kv.dtype)}"), mib_line
        if snap.kv.kind == "paged":
            blocks = app.query_one(BlockMap)
            assert blocks.snapshot == snap
            assert blocks.border_title == f"KV blocks ({snap.kv.n_blocks} × {snap.kv.block_size} tokens)"
            per_cell = blocks.per_cell(blocks.size.width)
            cells = blocks.render().plain.split("\n", 1)[1]
            assert len(cells) * per_cell >= snap.kv.n_blocks > (len(cells) - 1) * per_cell, "blocks missing"
            rows_needed = 1 + -(-len(cells) // max(1, blocks.size.width))
            assert blocks.size.height >= rows_needed, "the block map is cut"
            owned = snap.kv.n_blocks - snap.kv.free_blocks
            assert blocks.render().plain.startswith(f"{owned}/{snap.kv.n_blocks} owned")

    rows = app.query_one(RequestList)
    assert rows.rids == tuple(v.rid for v in snap.requests), (
        f"the list has {rows.rids}, the snapshot {tuple(v.rid for v in snap.requests)}"
    )
    for v in snap.requests:
        line = rows.row_text(v.rid)
        assert v.state in line, f"#{v.rid} is {v.state}, its row says {line!r}"
        assert f"{len(v.tokens)}/{v.max_new_tokens}" in line, f"#{v.rid} tokens: row {line!r}"

    pane = app.query_one(RequestPane)
    header = pane.query_one("#pane-header").text.plain
    sel = app.selected
    v = snap.request(sel) if sel is not None else None
    if v is None:
        assert pane.body_text == "", "the pane shows text of a request the snapshot does not hold"
        assert ("No request selected" in header) if sel is None else (f"#{sel} " in header), header
    else:
        assert header.startswith(f"#{v.rid} {v.state}"), f"pane {header!r}, request #{v.rid} is {v.state}"
        assert f"{len(v.tokens)}/{v.max_new_tokens} tok" in header, header
        assert pane.body_text == frame.prompts.get(v.rid, "") + frame.texts.get(v.rid, "")
        body = pane.query_one("#pane-body").render().plain
        if v.state in ("queued", "preempted", "running") and steps:  # the step's batch, or why not
            mine = dict(snap.batch).get(v.rid)
            if mine is not None:
                assert f"step {steps}: in the batch, {mine} token" in body, body[-200:]
            elif v.wait:
                assert f"step {steps}: waiting: {v.wait_detail or v.wait}" in body, body[-200:]
        assert rows.selected_rid() == v.rid, "the list's cursor is not on the selected request"

    timeline = app.query_one(TimelinePanel)
    if timeline.display:
        assert timeline.tracks == frame.tracks and timeline.now_step == steps

    log = app.query_one(EventLog)
    shown = [e.seq for e in log.lines]  # the frame's entries, after those kept from before (scrollback)
    want = [e.seq for e in frame.log][-len(shown) :] if shown else []
    assert shown[-len(want) :] == want and (shown or not frame.log), "the event log is not the frame's"
    return frame
