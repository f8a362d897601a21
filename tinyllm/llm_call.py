"""One ``LLM.generate`` / ``LLM.chat`` call as it runs: its prompts' engine requests (``Job``), each
sample's outputs read as vLLM gives them (``SampleReader``: stop strings applied, the stop token's
text left out, logprobs kept), and the ``Stream`` the caller iterates.

The engine runs in the LLM's EngineLoop thread (tinyllm/serve/engine_loop.py). A call submits its
requests there and waits for their outputs in an asyncio event loop of its own, run in the
caller's thread one step at a time (``Stream._advance``): so a call never steps the engine itself,
several threads can call at once, and streams read in any order each get their own text.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from tinyllm.engine.scoring import prompt_logprobs
from tinyllm.outputs import CompletionOutput, Delta, RequestOutput, logprob_list
from tinyllm.request import Request
from tinyllm.sampling_params import SamplingParams
from tinyllm.serve.handle import Output, RequestFailed, RequestHandle, RequestRejected
from tinyllm.stops import StopText

_request_ids = itertools.count()  # vLLM numbers requests per process, "0", "1", ...


@dataclass
class Job:
    """One prompt of a call: its engine request (checked), settings and stop strings."""

    index: int
    prompt: str | None
    ids: list[int]
    params: SamplingParams
    request: Request
    stops: tuple[str, ...]
    samples: list[SampleReader] = field(default_factory=list)
    prompt_logprobs: list | None = None


class SampleReader:
    """One sample's outputs as the caller sees them: text with stop strings applied (and the
    stop token's text left out, as vLLM), tokens, logprobs, how it ended."""

    def __init__(self, job: Job, index: int, handle: RequestHandle, tok: Any):
        p = job.params
        self.job, self.index, self.handle = job, index, handle
        self.text = (
            StopText(tok.stream(skip_special_tokens=p.skip_special_tokens), job.stops, p.min_tokens)
            if tok is not None and p.detokenize
            else None
        )
        self.tokens: list[int] = []
        self.logprobs: list = []
        self.pieces: list[str] = []
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.out: Output | None = None

    def take(self, out: Output) -> Delta | None:
        """The new text of ``out`` as a Delta (None if nothing new and not finished)."""
        p, text, piece = self.job.params, self.text, ""
        last = len(out.tokens) - 1
        for i, t in enumerate(out.tokens):
            if text is not None and text.stopped:
                break  # on their way before the engine heard of the stop string
            self.tokens.append(t)
            if i < len(out.logprobs):
                self.logprobs.append(out.logprobs[i])
            stop_token = out.finished and i == last and out.finish_reason == "stop"  # EOS or a stop token id
            if text is None or (stop_token and not p.include_stop_str_in_output):
                continue
            piece += text.step(t)
            if text.stopped:
                self.handle.finish(text.tokens)  # a no-op if it ended already
                if p.include_stop_str_in_output:
                    piece += text.matcher.matched
        if out.finished:
            self.out = out
            stopped = text is not None and text.stopped
            if text is not None and not stopped:
                piece += text.flush()
            self.finish_reason = "stop" if stopped else out.finish_reason
            if stopped:
                self.stop_reason = text.matcher.matched
            elif out.finish_reason == "stop" and self.tokens and self.tokens[-1] != self.job.request.eos_id:
                self.stop_reason = self.tokens[-1]  # a stop token id (EOS: None, as vLLM)
        self.pieces.append(piece)
        if piece or out.finished:
            return Delta(self.job.index, self.index, piece, out.tokens[-1] if out.tokens else None, self.finish_reason)
        return None

    def fail(self, why: str) -> Delta:
        self.finish_reason = "error"
        return Delta(self.job.index, self.index, "", None, "error")

    def output(self, tok: Any) -> CompletionOutput:
        want = self.job.params.logprobs is not None
        text_of = tok.token_text if tok is not None and self.job.params.detokenize else None
        acc = self.out.accounting if self.out is not None else None
        ttft = latency = math.nan
        if acc is not None and acc.queue_ms is not None and acc.prefill_ms is not None:
            ttft = (acc.queue_ms + acc.prefill_ms) / 1000
        if acc is not None and acc.e2e_ms is not None:
            latency = acc.e2e_ms / 1000
        return CompletionOutput(
            self.index,
            "".join(self.pieces),
            list(self.tokens),
            sum(lp.logprob for lp in self.logprobs) if want else None,
            logprob_list(self.logprobs, text_of) if want else None,
            self.finish_reason,
            self.stop_reason,
            ttft,
            latency,
        )


class Stream:
    """The outputs of one ``generate``/``chat`` call as they come: iterate for Deltas (with
    ``stream=True``), or ``outputs()`` for the RequestOutputs once all have ended. Its requests
    run while it is open; ``close()`` (or leaving its ``with`` block, or dropping it) aborts what
    is left. Each call waits in an asyncio event loop of its own, run in the caller's thread."""

    def __init__(self, llm: Any, jobs: list[Job], progress: bool):
        self._llm = llm
        self._aloop = asyncio.new_event_loop()
        self._agen = answer(llm, jobs, Progress.start(len(jobs), progress, jobs))
        self._results: list[RequestOutput] | None = None
        self._closed = False

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Delta:
        while True:
            item = self._advance()
            if isinstance(item, Delta):
                return item
            self._results = item

    def outputs(self) -> list[RequestOutput]:
        """Run to the end; a RequestOutput per prompt, in order."""
        for _ in self:
            pass
        assert self._results is not None
        return self._results

    def close(self) -> None:
        """Abort what is still running (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._aloop.run_until_complete(self._agen.aclose())
        finally:
            self._aloop.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the engine thread may be gone
            pass

    def _advance(self) -> Any:
        if self._closed:
            raise StopIteration
        try:
            return self._aloop.run_until_complete(self._agen.__anext__())
        except StopAsyncIteration:
            self.close()
            raise StopIteration from None
        except BaseException:
            self.close()  # an error or ^C: nothing of this call keeps running
            raise


async def answer(llm: Any, jobs: list[Job], progress: Progress) -> AsyncIterator[Delta | list[RequestOutput]]:
    """Submit every job's samples to the engine thread, yield each new piece of text as it comes,
    and, last, the RequestOutputs. Whatever is unfinished when this ends is aborted."""
    loop, tok = llm._loop, llm._tok
    samples: list[SampleReader] = []
    tasks: dict[asyncio.Future, SampleReader] = {}
    try:
        for job in jobs:
            if job.params.prompt_logprobs is not None:
                ids, k = job.ids, job.params.prompt_logprobs
                job.prompt_logprobs = await asyncio.wrap_future(
                    loop.call_future(lambda eng, ids=ids, k=k: prompt_logprobs(eng.model, ids, k))
                )
            handles = loop.submit_samples(job.request, job.params.n, job.stops)
            job.samples = [SampleReader(job, j, h, tok) for j, h in enumerate(handles)]
            samples += job.samples
        for s in samples:
            try:
                await s.handle.accepted()
            except (RequestRejected, RequestFailed) as e:  # checked before: only a changed engine gets here
                raise ValueError(f"prompt {s.job.index}: {e}") from None
        tasks = {asyncio.ensure_future(s.handle.next_output()): s for s in samples}
        while tasks:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: (tasks[f].job.index, tasks[f].index)):
                s = tasks.pop(fut)
                try:
                    out = fut.result()
                except RequestFailed as e:
                    yield s.fail(str(e))
                    progress.sample_ended(s)
                    continue
                delta = s.take(out)
                if delta is not None:
                    yield delta
                if out.finished:
                    progress.sample_ended(s)
                else:
                    tasks[asyncio.ensure_future(s.handle.next_output())] = s
        yield [request_output(job, tok) for job in jobs]
    finally:
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        unfinished = [s for s in samples if not s.handle.ended]
        for s in unfinished:
            s.handle.close()
        if unfinished and loop.alive:  # the engine thread applies commands in order: once this
            await loop.call_async(lambda eng: None)  # returns, the aborts are done (no slot left held)
        progress.stop()


def request_output(job: Job, tok: Any) -> RequestOutput:
    text_of = tok.token_text if tok is not None and job.params.detokenize else None
    first = job.samples[0].out
    return RequestOutput(
        str(next(_request_ids)),
        job.prompt,
        list(job.ids),
        None if job.prompt_logprobs is None else logprob_list(job.prompt_logprobs, text_of),
        [s.output(tok) for s in job.samples],
        finished=True,
        num_cached_tokens=first.cached_tokens if first is not None else 0,
    )


class Progress:
    """vLLM's "Processed prompts" bar (rich, on stderr), only where stderr is a terminal."""

    def __init__(self, bar: Any, task: Any, jobs: list[Job]):
        self.bar, self.task, self.jobs = bar, task, jobs
        self.left = {id(j): j.params.n for j in jobs}
        self.out_tokens = 0

    @classmethod
    def start(cls, total: int, wanted: bool, jobs: list[Job]) -> Progress:
        if not wanted or not sys.stderr.isatty():
            return cls(None, None, jobs)
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(
            TextColumn("Processed prompts"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[speed]}"),
            console=Console(stderr=True),
        )
        bar.start()
        return cls(bar, bar.add_task("", total=total, speed=""), jobs)

    def sample_ended(self, s: SampleReader) -> None:
        self.out_tokens += len(s.tokens)
        self.left[id(s.job)] -= 1
        if self.bar is None or self.left[id(s.job)]:
            return
        elapsed = self.bar.tasks[0].elapsed or 1e-9
        prompt_tokens = sum(len(j.ids) for j in self.jobs if not self.left[id(j)])
        speed = f"input: {prompt_tokens / elapsed:.1f} toks/s, output: {self.out_tokens / elapsed:.1f} toks/s"
        self.bar.update(self.task, advance=1, speed=speed)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
