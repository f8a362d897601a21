"""Regenerate the panes view's text captures (README, docs/app.md): the same tight paged pool as
docs/screenshot.svg (6 slots, 40 blocks of 16, 24 tokens a step), run step by step, captured at
two steps: the pool full (a finished request and three preempted ones wait in their panes), then
two steps later the hand-over (a preempted request back in the finished one's slot, another
recomputing its context, one still waiting).

    .venv/bin/python scripts/panes_capture.py [WIDTH HEIGHT [STEP ...]]

writes docs/panes-WxH-stepN.txt for each step (default 100 x 30, steps 168 and 170).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from screenshot import demo_app, step_once, wait_for_requests  # (scripts/: the same app)


async def main(width: int, height: int, steps: list[int]) -> None:
    app = demo_app(panes=True)
    async with app.run_test(size=(width, height)) as pilot:
        await wait_for_requests(app, pilot)
        for target in sorted(steps):
            while app.runner.steps_done < target:
                await step_once(app, pilot)
            app.refresh_from_runner(force=True)
            await pilot.pause(0.3)
            lines = ["".join(seg.text for seg in strip).rstrip() for strip in app.screen._compositor.render_strips()]
            out = Path(f"docs/panes-{width}x{height}-step{target}.txt")
            out.write_text("\n".join(lines) + "\n")
            print(f"wrote {out}")


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(*(args[:2] or [100, 30]), args[2:] or [168, 170]))
