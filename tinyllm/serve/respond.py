"""Answering a generation request once its samples are accepted: the whole response at once
(``complete``) or streamed as server-sent events (``CompletionStream``). Both watch the connection
and abort the request as soon as its client goes away, and both carry the request's accounting
in a ``"tinyllm"`` field (tinyllm/observe/accounting.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from tinyllm.serve.body import ApiError, error_body
from tinyllm.serve.chat import ChatShape
from tinyllm.serve.completions import CompletionShape, Echo, Piece, joined_logprobs, usage
from tinyllm.serve.handle import Output, RequestFailed, RequestHandle
from tinyllm.serve.protocol import GenerationParams
from tinyllm.serve.reader import OutputReader

log = logging.getLogger("tinyllm.serve")
REQUEST_ID_HEADER = "x-tinyllm-request-id"  # the engine's id for the request (its row in the viewers)
ACCOUNTING_FIELD = "tinyllm"  # the extension field of a final response / stream chunk


async def _wait_disconnect(receive: Receive) -> None:
    """Return when the client has gone (the request body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _retrieve(fut: asyncio.Future) -> None:
    """Read a finished future's outcome, so asyncio does not log it as "never retrieved"."""
    if not fut.cancelled():
        fut.exception()


def close_all(handles: list[RequestHandle]) -> None:
    """Abort every sample that has not ended (each close is a no-op once its request ended)."""
    for h in handles:
        h.close()


def _rids(handles: list[RequestHandle]) -> str:
    """The request id header: the engine's id of each sample (choice order), comma-separated."""
    return ",".join(str(h.rid) for h in handles)


def _indexed(body: dict, i: int) -> dict:
    """``body`` (a response or chunk built for one choice) as choice ``i`` of n."""
    body["choices"][0]["index"] = i
    return body


@dataclass(frozen=True)
class Job:
    """What an answer is made of: the request's samples (one handle each), its parameters and
    prompt, the served model's name, and the API's shape (completions or chat)."""

    handles: list[RequestHandle]
    tokenizer: Any
    p: GenerationParams
    prompt: list[int]
    model: str
    shape: Any = CompletionShape
    echo: Echo | None = None  # completions' echo: the prompt before each choice's text


async def complete(request: Request, job: Job) -> Response:
    """A non-streaming completion, one choice per handle (n samples), aborted if the client
    disconnects while it is generated. Usage counts the prompt once and every choice's tokens;
    the top-level accounting is choice 0's (the sample that computed the prompt)."""
    handles, tokenizer, p, prompt, model, shape = job.handles, job.tokenizer, job.p, job.prompt, job.model, job.shape
    echo = job.echo
    start = len(echo.text) if echo is not None else 0
    readers = [OutputReader(tokenizer, h, p, chat=shape is ChatShape, offset=start) for h in handles]

    async def collect(reader: OutputReader, handle: RequestHandle) -> Output:
        while True:
            out = await handle.next_output()
            reader.take(out)
            if out.finished:
                return out

    tasks = [asyncio.ensure_future(collect(r, h)) for r, h in zip(readers, handles)]
    work = asyncio.gather(*tasks)
    gone = asyncio.ensure_future(_wait_disconnect(request.receive))
    try:
        await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()  # it ends with a CancelledError nobody awaits:
            work.add_done_callback(_retrieve)  # read it, or asyncio logs "never retrieved"
            close_all(handles)  # client gone (or we were cancelled): abort
    if not work.done() or work.cancelled():
        return Response(status_code=499)  # nobody reads it
    try:
        finals = work.result()
    except RequestFailed as e:
        for t in tasks:
            t.cancel()
        close_all(handles)  # one sample failed: the answer is an error
        raise ApiError(str(e), None, None, 500, "server_error") from None
    cid, ret_ids = shape.new_id(), p.return_token_ids
    use = usage(len(prompt), sum(len(r.tokens) for r in readers), finals[0].cached_tokens)
    body: dict = {}
    for i, (reader, out) in enumerate(zip(readers, finals)):
        toks = reader.tokens
        text = reader.text if reader.stopped else tokenizer.decode(toks, skip_special_tokens=True)
        text = text if echo is None else echo.text + text
        one = _indexed(
            shape.response(
                cid, model, Piece(text, reader.finish_reason(out), *((toks, prompt) if ret_ids else ())), use
            ),
            i,
        )
        if reader.want_logprobs:
            one["choices"][0]["logprobs"] = joined_logprobs(echo.logprobs if echo else None, reader.all_logprobs())
        if i == 0:
            body = one
        else:
            body["choices"].append(one["choices"][0])
    return JSONResponse(_with_accounting(body, finals[0].accounting), headers={REQUEST_ID_HEADER: _rids(handles)})


def _with_accounting(body: dict, acc) -> dict:
    """``body`` with the request's accounting as the ``"tinyllm"`` extension field (see
    tinyllm/observe/accounting.py): queue/prefill/decode/e2e ms, preemptions, cached tokens."""
    if acc is not None:
        body[ACCOUNTING_FIELD] = acc.as_dict()
    return body


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class CompletionStream(Response):
    """Server-sent events in OpenAI's format, ending with ``data: [DONE]``. Runs the stream and
    a disconnect watcher side by side; whichever ends first ends the other, and a request whose
    client went away is aborted at once (not at the next token write)."""

    media_type = "text/event-stream"

    def __init__(self, job: Job):
        self.status_code, self.background = 200, None  # no body: no content-length (as StreamingResponse)
        self.init_headers({"cache-control": "no-cache", REQUEST_ID_HEADER: _rids(job.handles)})
        self.handles, self.tok, self.p, self.prompt, self.model = (
            job.handles,
            job.tokenizer,
            job.p,
            job.prompt,
            job.model,
        )
        self.shape, self.echo = job.shape, job.echo

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pump = asyncio.ensure_future(self._pump(send))
        gone = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await asyncio.wait((pump, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            pump.cancel()
            close_all(self.handles)  # no-op once the requests finished
        if pump.done() and not pump.cancelled() and pump.exception() is not None:
            e = pump.exception()
            if not isinstance(e, OSError):  # a write to a closed connection is expected
                log.error("completion stream failed: %r", e)

    async def _pump(self, send: Send) -> None:
        """Each choice's chunks as its tokens arrive (n samples: interleaved, each chunk with its
        choice's index; each choice's last chunk carries its accounting); the usage chunk counts
        the prompt once, the tokens of every choice, and carries choice 0's accounting."""
        p, shape, handles = self.p, self.shape, self.handles
        cid, created = shape.new_id(), int(time.time())
        start = len(self.echo.text) if self.echo is not None else 0
        readers = [OutputReader(self.tok, h, p, chat=shape is ChatShape, offset=start) for h in handles]
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        first, n, last = [True] * len(handles), 0, [None] * len(handles)
        opened = [False] * len(handles)
        waiting = {i: asyncio.ensure_future(h.next_output()) for i, h in enumerate(handles)}
        try:
            while waiting:
                done, _ = await asyncio.wait(waiting.values(), return_when=asyncio.FIRST_COMPLETED)
                for i in [i for i, t in waiting.items() if t in done]:
                    out = waiting.pop(i).result()
                    text, kept, lps = readers[i].take(out)
                    n += len(kept)
                    if not opened[i]:  # with its first token, as vLLM: a client's TTFT clock starts there
                        opened[i] = True
                        for opening in self._openings(cid, created, i):
                            await send({"type": "http.response.body", "body": _sse(opening), "more_body": True})
                    if kept or out.finished:  # a chunk per output, text or not yet (as vLLM)
                        ids = kept if p.return_token_ids else None
                        prompt_ids = self.prompt if first[i] and p.return_token_ids else None
                        piece = Piece(text, readers[i].finish_reason(out), ids, prompt_ids)
                        c = _indexed(shape.chunk(cid, created, self.model, piece, p.include_usage), i)
                        if lps is not None:
                            c["choices"][0]["logprobs"] = lps
                        if out.finished:
                            c = _with_accounting(c, out.accounting)
                        first[i] = False
                        await send({"type": "http.response.body", "body": _sse(c), "more_body": True})
                    if out.finished:
                        last[i] = out
                    else:
                        waiting[i] = asyncio.ensure_future(handles[i].next_output())
            if p.include_usage:
                u = _with_accounting(
                    shape.usage_chunk(cid, created, self.model, usage(len(self.prompt), n, last[0].cached_tokens)),
                    last[0].accounting,
                )
                await send({"type": "http.response.body", "body": _sse(u), "more_body": True})
        except RequestFailed as e:  # the engine failed it: say so in the stream
            await send(
                {"type": "http.response.body", "more_body": True, "body": _sse(error_body(str(e), "server_error"))}
            )
        finally:
            for t in waiting.values():
                t.cancel()
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    def _openings(self, cid: str, created: int, i: int) -> list[dict]:
        """What opens choice ``i``'s stream: chat's role chunk, completions' echoed prompt."""
        out = []
        opening = self.shape.first_chunk(cid, created, self.model, self.p.include_usage)
        if opening is not None:
            out.append(_indexed(opening, i))
        if self.echo is not None:
            c = _indexed(
                self.shape.chunk(cid, created, self.model, Piece(self.echo.text, None), self.p.include_usage), i
            )
            c["choices"][0]["logprobs"] = self.echo.logprobs
            out.append(c)
        return out
