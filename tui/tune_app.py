"""``tinyllm-tui --tune SOURCE …``: a tuning session (``tinyllm tune``'s options) watched live.

The search runs in a worker thread of this process (the stand-in model's passes are small);
each point that finishes lands in the table of the best so far (on the longest prefix of the
requests run yet: successive halving's latest round), the sparkline follows the best figure
after every run, and when the search ends the answer (the same tables ``tinyllm tune`` prints)
fills the log below. ``q`` quits; the answer is printed to the terminal too, and ``--json``
written, as the CLI does.
"""

from __future__ import annotations

import time

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, RichLog, Sparkline, Static

from tinyllm.tune.evaluate import Outcome
from tinyllm.tune.report import figure
from tinyllm.tune.search import ranked
from tinyllm.tune.session import Answer, Session, execute

SHOWN = 12  # rows of the best-so-far table


class _Log:
    """rich's ``print`` onto a RichLog (report.print_answer writes to either)."""

    def __init__(self, log: RichLog):
        self.log = log

    def print(self, renderable="", **_: object) -> None:
        self.log.write(renderable)


class _Stopped(Exception):
    """The view was closed: the search stops at its next point."""


class TuneApp(App):
    """The live view of one tuning session (see the module docstring)."""

    CSS = """
    #title { height: 1; background: $boost; }
    #status { height: 1; color: $text-muted; }
    Sparkline { height: 3; margin: 0 1; }
    DataTable { height: 15; }
    RichLog { height: 1fr; border-top: solid $primary; }
    """
    BINDINGS = [Binding("q", "quit", "quit")]

    def __init__(self, session: Session):
        super().__init__()
        self.session = session
        self.outcomes: list[Outcome] = []
        self.best: list[float] = []  # the best figure after each run (on its round's prefix)
        self.phase = ""
        self.answer: Answer | None = None
        self.error: BaseException | None = None
        self.started = time.perf_counter()
        self.stopping = False

    def compose(self) -> ComposeResult:
        a = self.session.args
        slo = self.session.bench.judging.slo
        yield Static(
            f" tune {a.source} · {len(self.session.bench.arrivals)} requests · SLO {slo or 'per request'} · "
            f"KV {self.session.kv_mib:g} MiB · {len(self.session.grid)} configurations · objective {a.objective}",
            id="title",
        )
        yield Static("", id="status")
        yield Sparkline([], summary_function=max)
        yield DataTable(zebra_stripes=True, cursor_type="none")
        yield RichLog(wrap=True)  # (the answer's long lines, command lines included, wrap: none is cut)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("#", "settings", self.session.args.objective, "met", "TTFT p95", "preempted", "requests")
        self.run_worker(self._work, thread=True, exit_on_error=False)

    def _work(self) -> None:
        def tell(fn, value) -> None:
            if self.stopping:
                raise _Stopped
            self.call_from_thread(fn, value)

        try:
            answer = execute(
                self.session,
                on_done=lambda o: tell(self.point_done, o),
                on_phase=lambda text: tell(self.phase_begins, text),
            )
            tell(self.finished, answer)
        except _Stopped:
            return
        except Exception as e:  # (shown, not a traceback over the screen)
            if not self.stopping:
                self.call_from_thread(self.failed, e)

    async def action_quit(self) -> None:
        self.stopping = True
        self.exit()

    def phase_begins(self, text: str) -> None:
        self.phase = text
        self._status()

    def point_done(self, o: Outcome) -> None:
        self.outcomes.append(o)
        longest = max(x.requests for x in self.outcomes)
        board = ranked([x for x in self.outcomes if x.requests == longest], self.session.args.objective)
        top = board[0]
        if not top.error:
            self.best.append(float(figure(top, self.session.args.objective).split()[0]))
            self.query_one(Sparkline).data = list(self.best)
        table = self.query_one(DataTable)
        table.clear()
        base = self.session.base
        for i, x in enumerate(board[:SHOWN], 1):
            table.add_row(
                str(i),
                "the defaults" if x.point == base else x.point.words(base),
                figure(x, self.session.args.objective),
                f"{x.met}/{x.judged}" if not x.error else "",
                f"{x.ttft_p95_s * 1e3:.0f} ms" if not x.error else "",
                str(x.preemptions) if not x.error else "",
                str(x.requests),
            )
        self._status()

    def _status(self) -> None:
        done = "" if self.answer is None else " · done: q quits"
        longest = max((x.requests for x in self.outcomes), default=0)
        board = f" · the table: the best on the first {longest} requests (the latest round)" if longest else ""
        self.query_one("#status", Static).update(
            f" {self.phase} · {len(self.outcomes)} runs · {time.perf_counter() - self.started:.0f} s{board}{done}"
        )

    def finished(self, answer: Answer) -> None:
        from tinyllm.tune.report import print_answer

        self.answer = answer
        self.phase = "finished"
        print_answer(self.session, answer, _Log(self.query_one(RichLog)))
        self._status()

    def failed(self, e: BaseException) -> None:
        self.error = e
        self.exit(return_code=1)
