"""The completions API's answers: a response, a streamed chunk, usage, logprobs, and
``CompletionShape`` naming them for the server's shared response code."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from tinyllm.request import TokenLogprob


@dataclass(frozen=True)
class Piece:
    """What an answer, or one streamed chunk of it, says, whichever API shapes it: its text, why
    it ended (None: not yet), and with return_token_ids its token ids and (once) the prompt's."""

    text: str
    finish_reason: str | None
    token_ids: list[int] | None = None
    prompt_ids: list[int] | None = None


def new_completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def completion(cid: str, model: str, piece: Piece, usage_: dict) -> dict:
    choice: dict = {"index": 0, "text": piece.text, "logprobs": None, "finish_reason": piece.finish_reason}
    if piece.token_ids is not None:
        choice["prompt_token_ids"], choice["token_ids"] = piece.prompt_ids, piece.token_ids
    return {
        "id": cid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage_,
    }


def chunk(cid: str, created: int, model: str, piece: Piece, include_usage: bool) -> dict:
    """One streamed piece; ``usage`` is null on every chunk but the last when include_usage."""
    choice: dict = {"index": 0, "text": piece.text, "logprobs": None, "finish_reason": piece.finish_reason}
    if piece.token_ids is not None:
        choice["token_ids"] = piece.token_ids
        if piece.prompt_ids is not None:
            choice["prompt_token_ids"] = piece.prompt_ids
    out = {"id": cid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}
    if include_usage:
        out["usage"] = None
    return out


LOGPROB_FLOOR = -9999.0  # as vLLM: a -inf logprob (a masked token) is JSON-safe this way


def completion_logprobs(lps: list[TokenLogprob], token_text, offset: int = 0) -> dict:
    """OpenAI's completions ``logprobs`` object for these tokens: ``tokens`` (each token's own
    text), ``token_logprobs``, ``top_logprobs`` (text → logprob, the chosen token included, as
    vLLM) and ``text_offset`` (where each token starts, counting from ``offset``)."""
    tokens = [token_text(lp.token) for lp in lps]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)

    def top(lp: TokenLogprob) -> dict:
        d = {token_text(t): max(v, LOGPROB_FLOOR) for t, v in lp.top}
        d.setdefault(token_text(lp.token), max(lp.logprob, LOGPROB_FLOOR))
        return d

    return {
        "tokens": tokens,
        "token_logprobs": [max(lp.logprob, LOGPROB_FLOOR) for lp in lps],
        "top_logprobs": [top(lp) for lp in lps],
        "text_offset": offsets,
    }


def echo_logprobs(ids: list[int], lps: list[TokenLogprob | None], token_text) -> dict:
    """The prompt's tokens in the ``logprobs`` object's shape, for ``echo``: the first token has
    nothing before it, so its ``token_logprobs`` and ``top_logprobs`` are null (as OpenAI and vLLM)."""
    first = token_text(ids[0])
    rest = completion_logprobs([lp for lp in lps[1:] if lp is not None], token_text, len(first))
    return {
        "tokens": [first, *rest["tokens"]],
        "token_logprobs": [None, *rest["token_logprobs"]],
        "top_logprobs": [None, *rest["top_logprobs"]],
        "text_offset": [0, *rest["text_offset"]],
    }


def joined_logprobs(a: dict | None, b: dict | None) -> dict | None:
    """Two logprobs objects one after the other (the echoed prompt's, then the completion's)."""
    if a is None or b is None:
        return a or b
    return {k: a[k] + b[k] for k in a}


@dataclass(frozen=True)
class Echo:
    """What ``echo`` puts before a completion: the prompt's text and, with ``logprobs``, its tokens'."""

    text: str
    logprobs: dict | None


def usage_chunk(cid: str, created: int, model: str, usage_: dict) -> dict:
    """The stream's last data chunk when stream_options.include_usage: no choices, the usage."""
    return {"id": cid, "object": "text_completion", "created": created, "model": model, "choices": [], "usage": usage_}


class CompletionShape:
    """How completions answer (the functions above, under the names the server's response code
    calls for either route; chat's are ``tinyllm.serve.chat.ChatShape``)."""

    new_id = staticmethod(new_completion_id)
    response = staticmethod(completion)
    chunk = staticmethod(chunk)
    usage_chunk = staticmethod(usage_chunk)

    @staticmethod
    def first_chunk(cid: str, created: int, model: str, include_usage: bool) -> dict | None:
        return None  # completions stream text from the first chunk
