"""``SamplingParams``: vLLM's per-request settings object, by vLLM's names, defaults and meanings.

A vLLM script builds one, reads and changes its fields (``sp.max_tokens``), ``clone()``s it and
hands it to ``LLM.generate``. Under it the engine takes one settings object, ``RequestSettings``
(tinyllm/request.py), which the server, the app's settings dialog and prompt files build too:
``settings()`` makes it, so every range is checked in one place. Fields vLLM has that this engine
cannot honour are refused by name when set (``UNSUPPORTED``), never silently ignored.
Matched against vLLM 0.32's ``vllm/sampling_params.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from tinyllm.request import MAX_LOGPROBS, RequestSettings, Sampling, SamplingError, is_int

UNSUPPORTED = {  # vLLM's field -> why it is refused here when set
    "logit_bias": "logit_bias is not supported by tinyllm's sampler",
    "allowed_token_ids": "allowed_token_ids is not supported by tinyllm's sampler",
    "bad_words": "bad_words is not supported by tinyllm's sampler",
    "structured_outputs": "structured outputs (guided decoding) are not supported by tinyllm",
    "logprob_token_ids": "logprob_token_ids is not supported: use logprobs=k for the top k",
    "prompt_logprob_token_ids": "prompt_logprob_token_ids is not supported: use prompt_logprobs=k",
    "thinking_token_budget": "thinking_token_budget is not supported by tinyllm (no reasoning parser)",
    "repetition_detection": "repetition_detection is not supported by tinyllm",
}


@dataclass
class SamplingParams:
    """Sampling settings for one request, vLLM's fields in vLLM's order (``max_tokens`` 16,
    ``temperature`` 1.0; ``top_k`` 0 or -1 and ``top_p`` 1.0 mean off; ``max_tokens=None``: as
    many as the context leaves). ``priority`` and ``tenant`` are tinyllm's own (the "priority"
    and "fair" scheduling policies; vLLM takes ``priority`` in ``generate``, as does tinyllm).
    Checked when built and again when used (a field may have been changed in between); a value
    out of range is a ``SamplingError`` (a ValueError) naming the field."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True  # accepted; the checkpoint's decoder decides the spacing
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    structured_outputs: Any = None
    logprob_token_ids: list[int] | None = None
    prompt_logprob_token_ids: list[int] | None = None
    thinking_token_budget: int | None = None
    repetition_detection: Any = None
    extra_args: dict[str, Any] | None = None  # vLLM: for plugins, unused in-tree; kept, unused here
    priority: int = 0
    tenant: str = ""

    def __post_init__(self) -> None:
        self.settings()

    def clone(self) -> SamplingParams:
        """A deep copy (vLLM's ``clone``): change it without touching this one."""
        return copy.deepcopy(self)

    def settings(self, room: int | None = None) -> RequestSettings:
        """The engine's settings for one prompt. ``room``: the tokens its context leaves after
        the prompt, which ``max_tokens=None`` takes (None: not known yet, only checked)."""
        for name, why in UNSUPPORTED.items():
            if getattr(self, name) not in (None, [], {}):
                raise SamplingError(name, f"{why}; got {name}={getattr(self, name)!r:.60}")
        for name in ("ignore_eos", "detokenize", "skip_special_tokens", "include_stop_str_in_output",
                     "spaces_between_special_tokens"):  # fmt: skip
            if not isinstance(getattr(self, name), bool):
                raise SamplingError(name, f"{name} must be True or False, got {getattr(self, name)!r}")
        max_tokens = self.max_tokens
        if max_tokens is None:
            max_tokens = max(1, self.min_tokens if room is None else room)
        elif not is_int(max_tokens) or max_tokens < 1:
            raise SamplingError("max_tokens", f"max_tokens must be an integer >= 1 or None, got {max_tokens!r}")
        if not is_int(self.top_k) or self.top_k < -1:
            raise SamplingError("top_k", f"top_k must be an integer >= 1, or 0 / -1 for no limit, got {self.top_k!r}")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (not is_int(v) or not 0 <= v <= MAX_LOGPROBS):
                raise SamplingError(
                    name, f"{name} must be an integer from 0 to {MAX_LOGPROBS} or None (-1, the whole "
                    f"vocabulary, is not supported), got {v!r}"
                )  # fmt: skip
        stop = () if self.stop is None else self.stop
        if stop and not self.detokenize:
            raise SamplingError("stop", "stop strings need detokenize=True (they are matched on the text)")
        stop_ids = self.stop_token_ids if self.stop_token_ids is not None else ()
        if isinstance(stop_ids, (list, tuple)):
            stop_ids = tuple(int(t) if _integral(t) else t for t in stop_ids)
        sampling = Sampling(
            self.temperature,
            self.top_k if is_int(self.top_k) and self.top_k > 0 else None,
            None if self.top_p == 1.0 else self.top_p,
            self.min_p,
            self.presence_penalty,
            self.frequency_penalty,
            self.repetition_penalty,
            self.seed,
        )
        return RequestSettings(
            sampling,
            max_tokens,
            not self.ignore_eos,
            self.priority,
            self.tenant,
            stop,
            stop_ids,
            self.min_tokens,
            self.logprobs,
            self.n,
        )

    @classmethod
    def of(cls, settings: RequestSettings) -> SamplingParams:
        """The SamplingParams of an engine settings object (what a prompt file or the app made)."""
        s = settings.sampling
        return cls(
            n=settings.n,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
            repetition_penalty=s.repetition_penalty,
            temperature=s.temperature,
            top_p=1.0 if s.top_p is None else s.top_p,
            top_k=s.top_k or 0,
            min_p=s.min_p,
            seed=s.seed,
            stop=list(settings.stop),
            stop_token_ids=list(settings.stop_token_ids),
            ignore_eos=not settings.stop_at_eos,
            max_tokens=settings.max_new_tokens,
            min_tokens=settings.min_tokens,
            logprobs=settings.logprobs,
            priority=settings.priority,
            tenant=settings.tenant,
        )

    def __repr__(self) -> str:  # the fields that differ from the defaults, as vLLM prints them
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if getattr(self, f.name) != f.default]
        return f"SamplingParams({', '.join(shown)})"


def _integral(t: Any) -> bool:
    """A NumPy or Python integer that is not a bool (a token id a caller may hold as np.int64)."""
    import numbers

    return isinstance(t, numbers.Integral) and not isinstance(t, bool)


def as_sampling_params(sp: Any, where: str = "sampling_params") -> SamplingParams:
    """``sp`` as SamplingParams (an engine RequestSettings converted); TypeError naming ``where``."""
    if isinstance(sp, SamplingParams):
        return sp
    if isinstance(sp, RequestSettings):
        return SamplingParams.of(sp)
    raise TypeError(f"{where} must be a SamplingParams, got {type(sp).__name__}")


def per_prompt(sampling_params: Any, n: int) -> list[SamplingParams]:
    """One SamplingParams per prompt: one for all (None: the defaults), or a list of ``n``."""
    if sampling_params is None:
        return [SamplingParams()] * n
    if isinstance(sampling_params, Sequence) and not isinstance(sampling_params, str):
        if len(sampling_params) != n:
            raise ValueError(
                f"sampling_params must be one SamplingParams or a list of one per prompt ({n}), "
                f"got a list of {len(sampling_params)}"
            )
        return [as_sampling_params(sp, f"sampling_params[{i}]") for i, sp in enumerate(sampling_params)]
    return [as_sampling_params(sampling_params)] * n
