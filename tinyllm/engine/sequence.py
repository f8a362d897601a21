"""The engine's record of one request (``Sequence``) and the token events ``step()`` returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from tinyllm.engine.sampler import Row
from tinyllm.observe.snapshot import RequestView
from tinyllm.request import Request, Sampling, TokenLogprob


def finish_reason(req: Request, toks: list[int]) -> str | None:
    """The stop rule, after each token: "eos" (its EOS), "stop" (one of its stop_token_ids),
    once at least min_tokens are out; else "length" at max_new_tokens; None: it goes on."""
    if len(toks) >= req.min_tokens:
        if req.eos_id is not None and toks[-1] == req.eos_id:
            return "eos"
        if toks[-1] in req.stop_token_ids:
            return "stop"
    return "length" if len(toks) >= req.max_new_tokens else None


def is_done(req: Request, toks: list[int]) -> bool:
    return finish_reason(req, toks) is not None


@dataclass(frozen=True)
class Event:
    """One generated token, as step() reports it (a server streams these)."""

    rid: int
    token: int
    done: bool  # the request finished with this token (EOS or max_new_tokens)
    reason: str = ""  # when done: "eos", "stop" (a stop token id) or "length"
    logprob: TokenLogprob | None = None  # only for a request that asked for logprobs


@dataclass(eq=False)
class Sequence:
    """The engine's record of one request, kept after it ends so viewers can show it.
    ``req`` is the engine's own frozen copy (prompt as a tuple), never the caller's object."""

    rid: int
    req: Request
    sampling: Sampling
    arrival: float
    out: list[int] = field(default_factory=list)
    state: str = "queued"
    slot: int | None = None
    first_token: float | None = None
    admitted: float | None = None  # its first admission (the end of its queue time)
    finish: float | None = None
    preemptions: int = 0
    error: str | None = None
    computed: int = 0  # chunked prefill: context tokens whose K/V is in the pool
    cached_tokens: int = 0  # of its prompt, served by the prefix cache at its first admission
    admit_cached: int = 0  # of its context, served by the cache at its latest (a recompute's too)
    prefilled: bool = False  # chunked prefill: sampled since its last (re)admission
    wait: tuple[str, str] | None = None  # why it computed nothing in the latest step: (code, detail)
    waited: dict[str, int] = field(default_factory=dict)  # steps spent waiting, per reason code
    view: RequestView | None = None  # cached snapshot view; None when stale
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token of out, if it asked
    fork_of: int | None = None  # n > 1: the id of the sample whose prompt it forks off
    forks: list[Sequence] = field(default_factory=list)  # samples waiting (not queued) for its prompt
    draft: list[int] = field(default_factory=list)  # this step's speculative draft (engine/speculate.py)
    spec_drafted: int = 0  # draft tokens verified for it, in all
    spec_kept: int = 0  # of those, kept
    spec_drafts: int = 0  # drafts verified for it
    last_draft: tuple[int, int, int] = (-1, 0, 0)  # its latest draft: (step, tokens, kept)
    _row: Row | None = field(default=None, repr=False)  # row()'s, kept while its bans hold
    _row_bans: bool = field(default=False, repr=False)  # whether that Row bans the stop ids

    def row(self) -> Row:
        """What the sampler needs to pick its next token: settings, history, bans, logprobs. Kept
        while its bans stay the same: it holds ``out`` itself (one list, only ever grown or cut in
        place), so a kept Row sees every token since."""
        r = self.req
        banning = len(self.out) < r.min_tokens
        if self._row is None or self._row_bans != banning:
            self._row = Row(self.sampling, r.prompt, self.out, r.stop_ids() if banning else (), r.logprobs)
            self._row_bans = banning
        return self._row

    def context(self) -> list[int]:
        """Prompt plus tokens generated so far (longer than the prompt only after a preemption)."""
        return [*self.req.prompt, *self.out]

    def context_len(self) -> int:
        return len(self.req.prompt) + len(self.out)

    def remaining(self) -> int:
        """Context tokens not yet computed (1 for a decoding sequence: its newest token)."""
        return len(self.req.prompt) + len(self.out) - self.computed

    def end(self, state: str, now: float) -> None:
        """Finished, aborted or failed at ``now``."""
        self.state, self.finish, self.view = state, now, None

    def snapshot_view(self) -> RequestView:
        """Its immutable view, rebuilt only after it changed (whoever changes it sets ``view = None``)."""
        if self.view is None:
            r = self.req
            wait, wait_detail = self.wait or ("", "")
            self.view = RequestView(
                rid=self.rid,
                state=self.state,
                slot=self.slot,
                prompt=r.prompt,
                tokens=tuple(self.out),
                max_new_tokens=r.max_new_tokens,
                sampling=self.sampling,
                eos_id=r.eos_id,
                arrival_s=self.arrival,
                first_token_s=self.first_token,
                finish_s=self.finish,
                preemptions=self.preemptions,
                error=self.error,
                cached_tokens=self.cached_tokens,
                priority=r.priority,
                tenant=r.tenant,
                wait=wait,
                wait_detail=wait_detail,
                admitted_s=self.admitted,
                spec_drafted=self.spec_drafted,
                spec_kept=self.spec_kept,
                last_draft_step=self.last_draft[0],
                last_draft=self.last_draft[1],
                last_kept=self.last_draft[2],
                spec_drafts=self.spec_drafts,
            )
        return self.view
