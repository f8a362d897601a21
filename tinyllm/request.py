"""What a request is, without torch: sampling settings, the request, its result, the fit rule.

Torch-free on purpose: the app validates what the user types (sampling values, prompt length)
before the engine process has even finished importing torch, so these must import in
milliseconds. ``tinyllm.engine`` re-exports every name here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def is_int(x) -> bool:
    """An int that is not a bool (``True`` is an int to Python, never a token id or a count)."""
    return isinstance(x, int) and not isinstance(x, bool)


DEFAULT_MAX_BATCHED_TOKENS = 256      # the token-budget scheduler's default budget per step
GREEDY_BELOW = 1e-5                   # a temperature below this is greedy (vLLM's _SAMPLING_EPS)


def is_greedy(temperature: float) -> bool:
    """The one rule for "this temperature means argmax": 0, or so small that logits / T would
    overflow float32 (the sampler and every display use it)."""
    return temperature < GREEDY_BELOW


class ContextTooLong(ValueError):
    """A prompt plus its max_new_tokens that cannot fit the context it would run in."""


def check_fits(prompt_len: int, max_new_tokens: int, limit: int, limit_name: str = "the context") -> None:
    """The one rule every path applies before running a request: prompt + max_new_tokens must
    fit ``limit`` tokens (a slot's max_len, the model's max_seq_len, ...). Raises
    ContextTooLong with the numbers and what to change."""
    need = prompt_len + max_new_tokens
    if need > limit:
        raise ContextTooLong(f"prompt is {prompt_len} tokens + max_new_tokens {max_new_tokens} = {need}, "
                             f"more than {limit_name} of {limit} tokens; shorten the prompt or lower "
                             f"max_new_tokens")


class SamplingError(ValueError):
    """A sampling setting out of range; ``field`` names which one (an HTTP 400's ``param``)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Sampling:
    """How to pick tokens (sample_next's settings). Frozen, so equal settings group together."""
    temperature: float = 0.0             # 0 (or below GREEDY_BELOW) = greedy
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not _finite(t) or t < 0:
            raise SamplingError("temperature", f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if self.top_k is not None and (not is_int(self.top_k) or self.top_k < 1):
            raise SamplingError("top_k", f"top_k must be an integer >= 1 or None (off), got {self.top_k!r}")
        p = self.top_p
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0):
            raise SamplingError("top_p", f"top_p must be a number in (0, 1] or None (off), got {p!r}")

    def describe(self, full: bool = False) -> str:
        """``greedy`` / ``T=0.8 k=40``; ``full=True`` names every setting (``T=0.8 k=40 p=—``),
        for the app's settings line where a missing field would look like a bug."""
        if is_greedy(self.temperature) and not full:
            return "greedy"
        k = None if self.top_k is None else str(self.top_k)
        p = None if self.top_p is None else f"{self.top_p:g}"
        parts = [f"T={self.temperature:g}"]
        parts += [f"{name}={v or '—'}" for name, v in (("k", k), ("p", p)) if full or v is not None]
        return " ".join(parts)


@dataclass(frozen=True)
class RequestSettings:
    """Everything a request asks for besides its prompt, as ONE object that travels whole from
    the prompt line, a workload file or an HTTP body to the engine's ``Request``."""
    sampling: Sampling = field(default_factory=Sampling)
    max_new_tokens: int = 100
    stop_at_eos: bool = True

    def __post_init__(self):
        if not isinstance(self.sampling, Sampling):
            raise ValueError(f"sampling must be a Sampling, got {type(self.sampling).__name__}")
        if not is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")

    def describe(self) -> str:
        """``T=0.8 k=— p=— new=120 eos=on``: the app's next-request line."""
        return f"{self.sampling.describe(full=True)} new={self.max_new_tokens} eos={'on' if self.stop_at_eos else 'off'}"

    def request(self, prompt: list[int] | tuple[int, ...], eos_id: int | None) -> Request:
        """The engine's request for ``prompt`` (``eos_id``: the tokenizer's end of text)."""
        return Request(prompt, self.max_new_tokens, eos_id if self.stop_at_eos else None, self.sampling)


@dataclass
class Request:
    """What a caller asks for. The engine copies it on ``add_request`` (the prompt as a tuple),
    so changing the caller's list afterwards cannot bypass the checks made there."""
    prompt: list[int] | tuple[int, ...]
    max_new_tokens: int
    eos_id: int | None = None
    sampling: Sampling | None = None     # ContinuousEngine only; None = the engine's settings

    def __post_init__(self):
        if not isinstance(self.prompt, (list, tuple)) or not self.prompt:
            raise ValueError(f"prompt must be a non-empty list of token ids, got {_short(self.prompt)}")
        bad = next((t for t in self.prompt if not (is_int(t) and t >= 0)), None)
        if bad is not None:
            raise ValueError(f"prompt token ids must be integers >= 0, got {bad!r}")
        if not is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.eos_id is not None and (not is_int(self.eos_id) or self.eos_id < 0):
            raise ValueError(f"eos_id must be an integer >= 0 or None, got {self.eos_id!r}")
        if self.sampling is not None and not isinstance(self.sampling, Sampling):
            raise ValueError(f"sampling must be a Sampling or None, got {type(self.sampling).__name__}")

    def frozen(self) -> Request:
        """A validated copy whose prompt is an immutable tuple (re-checks everything: the
        caller may have changed this request since it was built)."""
        return Request(tuple(self.prompt) if isinstance(self.prompt, (list, tuple)) else self.prompt,
                       self.max_new_tokens, self.eos_id, self.sampling)


def _finite(x: int | float) -> bool:
    """math.isfinite, but False (not OverflowError) for an int too large for a float."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def _short(x) -> str:
    r = repr(x)
    return r if len(r) <= 40 else r[:37] + "..."


@dataclass
class Result:
    tokens: list[int]          # generated tokens only (EOS included if it was produced)
    ttft_s: float              # arrival → first generated token
    latency_s: float           # arrival → last generated token
