"""``tinyllm-tui --tune``: the command line, checked before the screen starts (one line, exit 2
for anything wrong: without Textual or torch loaded, so a typo is refused at once), then the
tuning session watched live (tui/tune_app.py) and its answer printed once the view closes."""

from __future__ import annotations

import sys

from tinyllm.args import OneLineParser, UsageError
from tinyllm.tune.command import add_tune_args


def main(argv: list[str]) -> int:
    """``tinyllm-tui --tune`` with the rest of the command line: checked (one line, exit 2) before
    the screen starts; the answer printed to the terminal once the view closes."""
    import json

    from rich.console import Console

    from tinyllm.args import refuse_writing_over
    from tinyllm.observe.recording import write_text
    from tinyllm.tune.report import answer_json, print_answer
    from tinyllm.tune.session import prepare

    parser = OneLineParser(prog="tinyllm-tui --tune", description="tinyllm tune, watched live")
    add_tune_args(parser)
    args = parser.parse_args(argv)
    try:
        refuse_writing_over("--json", args.json, args.source)
        session = prepare(args)
    except UsageError as e:
        parser.exit(2, f"tinyllm-tui --tune: error: {e}\n")
    from tui.tune_app import TuneApp  # (Textual: once every argument is checked)

    app = TuneApp(session)
    app.run()
    if app.error is not None:
        print(f"tinyllm-tui --tune: error: {type(app.error).__name__}: {app.error}", file=sys.stderr)
        return 1
    if app.answer is None:
        print("tinyllm-tui --tune: stopped before the search finished", file=sys.stderr)
        return 130
    print_answer(session, app.answer, Console())
    if args.json:
        write_text(args.json, json.dumps(answer_json(session, app.answer), indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
