"""One request's outputs as its client sees them: stop strings applied, logprobs in OpenAI's shape.

Shared by the streaming and non-streaming answers (and by both routes): the handler feeds each
``Output`` the engine loop delivers; the reader returns the text a client may see now (text that
could still turn into a stop string is held back, tinyllm.stops), the tokens kept, and their
logprobs. When a stop string matches it finishes the request in the engine at once (keeping the
tokens up to the one that completed the stop, so no slot or block outlives the answer); tokens
that were already on their way are dropped.
"""

from __future__ import annotations

from typing import Any

from tinyllm.request import TokenLogprob
from tinyllm.serve.chat import chat_logprobs
from tinyllm.serve.completions import completion_logprobs
from tinyllm.serve.handle import Output, RequestHandle
from tinyllm.serve.protocol import GenerationParams
from tinyllm.stops import StopText


class OutputReader:
    def __init__(self, tokenizer: Any, handle: RequestHandle, p: GenerationParams, chat: bool = False, offset: int = 0):
        self.tok, self.handle = tokenizer, handle
        self.chat, self.top_n = chat, p.logprobs or 0  # chat: logprobs in chat's shape (chat_logprobs)
        self.stop = StopText(tokenizer.stream(skip_special_tokens=True), p.stop, p.min_tokens)
        self.want_logprobs = p.logprobs is not None
        self.tokens: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.text = ""  # what was emitted so far
        self._start = self._offset = offset  # text_offset of the first token / the next (after an echo)

    @property
    def stopped(self) -> bool:
        return self.stop.stopped

    def take(self, out: Output) -> tuple[str, list[int], dict | None]:
        """(text to emit now, the tokens kept of ``out``, their completions logprobs object or None)."""
        text, kept, lps = "", [], []
        for i, t in enumerate(out.tokens):
            if self.stop.stopped:
                break
            text += self.stop.step(t)
            kept.append(t)
            if i < len(out.logprobs):
                lps.append(out.logprobs[i])
            if self.stop.stopped:
                self.handle.finish(self.stop.tokens)  # no-op if it ended already
        if out.finished:
            text += self.stop.flush()
        self.tokens += kept
        self.logprobs += lps
        self.text += text
        return text, kept, self._logprobs_object(lps)

    def finish_reason(self, out: Output) -> str | None:
        """The engine's reason, but "stop" once a stop string matched (even if the engine had
        reached max_tokens before it heard)."""
        return "stop" if out.finished and self.stop.stopped else out.finish_reason

    def all_logprobs(self) -> dict | None:
        """The logprobs object of every token kept (a non-streaming answer)."""
        if not self.want_logprobs:
            return None
        if self.chat:
            return chat_logprobs(self.logprobs, self.tok.token_text, self.top_n)
        return completion_logprobs(self.logprobs, self.tok.token_text, self._start)

    def _logprobs_object(self, lps: list[TokenLogprob]) -> dict | None:
        if not self.want_logprobs:
            return None
        if self.chat:
            return chat_logprobs(lps, self.tok.token_text, self.top_n)
        obj = completion_logprobs(lps, self.tok.token_text, self._offset)
        self._offset += sum(len(t) for t in obj["tokens"])
        return obj
