"""What ``LLM.generate`` and ``LLM.chat`` return, by vLLM's names and types: ``RequestOutput`` (a
prompt and its samples), ``CompletionOutput`` (one sample), ``Logprob`` (one token's
log-probability, rank and text), and ``Delta`` (a streamed piece, tinyllm's own).

Logprobs are vLLM's shape: one dict per position, token id -> Logprob, holding the chosen token
and the top alternatives. Matched against vLLM 0.32's ``vllm/outputs.py`` and
``vllm/logprobs.py``. tinyllm's shortcuts stay where they clash with nothing: ``out.text`` is the
first sample's text, ``ttft_s`` / ``latency_s`` a sample's times.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tinyllm.request import TokenLogprob


@dataclass(frozen=True)
class Logprob:
    """A token's log-probability, its rank in the distribution (1: the most likely), and its
    text (None when the request asked for no detokenizing)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PositionLogprobs = dict[int, Logprob]  # one position: token id -> Logprob, the chosen token first


def position_logprobs(lp: TokenLogprob, text: Callable[[int], str] | None) -> PositionLogprobs:
    """One position in vLLM's shape: the chosen token, then the top alternatives by rank."""
    out = {lp.token: Logprob(lp.logprob, lp.rank, text(lp.token) if text else None)}
    for rank, (tok, value) in enumerate(lp.top, 1):
        out.setdefault(tok, Logprob(value, rank, text(tok) if text else None))
    return out


def logprob_list(
    lps: Sequence[TokenLogprob | None], text: Callable[[int], str] | None
) -> list[PositionLogprobs | None]:
    """Every position's dict (None where a position has none: a prompt's first token)."""
    return [None if lp is None else position_logprobs(lp, text) for lp in lps]


@dataclass
class CompletionOutput:
    """One sample of a prompt (vLLM's ``CompletionOutput``). ``finish_reason``: "stop" (EOS, a
    stop token or string), "length", "abort", or "error" (the engine failed it); ``stop_reason``:
    the stop string or stop token id that ended it (None for EOS or length, as vLLM)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None  # the sum of the chosen tokens' logprobs (with logprobs=k)
    logprobs: list[PositionLogprobs] | None  # one dict per generated token (with logprobs=k)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    ttft_s: float = math.nan  # tinyllm's: arrival -> first token
    latency_s: float = math.nan  # tinyllm's: arrival -> the end

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A prompt and its samples (vLLM's ``RequestOutput``). ``text``, ``token_ids``,
    ``finish_reason`` and ``logprobs`` are the first sample's (tinyllm's shortcuts)."""

    request_id: str
    prompt: str | None  # None when the prompt was given as token ids
    prompt_token_ids: list[int]
    prompt_logprobs: list[PositionLogprobs | None] | None
    outputs: list[CompletionOutput]
    finished: bool = True
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def logprobs(self) -> list[PositionLogprobs] | None:
        return self.outputs[0].logprobs


@dataclass(frozen=True)
class Delta:
    """A streamed piece: ``text`` new for sample ``index`` of prompt ``prompt`` (its position in
    the call); the last piece of a sample carries its ``finish_reason``."""

    prompt: int
    index: int
    text: str
    token_id: int | None
    finish_reason: str | None = None
