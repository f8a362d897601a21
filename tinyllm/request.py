"""What a request is, without torch: sampling settings, the request, its result, the fit rule.

Torch-free on purpose: the app validates what the user types (sampling values, prompt length)
before the engine process has even finished importing torch, so these must import in
milliseconds. ``tinyllm.engine`` re-exports every name here.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace


def token_ids(prompt):
    """A NumPy or torch integer array, or a list of NumPy integers, as a plain list of ints (what
    a caller holding model inputs has); anything else unchanged, for the checks to name."""
    if hasattr(prompt, "tolist") and not isinstance(prompt, (list, tuple, str)):
        prompt = prompt.tolist()
    if isinstance(prompt, (list, tuple)) and any(not is_int(t) and isinstance(t, numbers.Integral) for t in prompt):
        prompt = [int(t) if isinstance(t, numbers.Integral) and not isinstance(t, bool) else t for t in prompt]
    return prompt


def is_int(x) -> bool:
    """An int that is not a bool (``True`` is an int to Python, never a token id or a count)."""
    return isinstance(x, int) and not isinstance(x, bool)


DEFAULT_MAX_BATCHED_TOKENS = 256  # the token-budget scheduler's default budget per step
DEFAULT_MAX_NUM_SEQS = 64  # the default cap on running sequences (vLLM's max_num_seqs)
SCHEDULING_POLICIES = ("fcfs", "priority", "shortest-first", "fair")  # engine/policy.py: one class each
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16")  # vLLM's kv_cache_dtype, those that apply (engine/forward.py)
KV_DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16"}  # how the screen writes them; accepted as typed


def kv_dtype_name(text: str) -> str | None:
    """A K/V dtype as a user typed it (a KV_CACHE_DTYPES name or a short one), canonical; None if
    it is neither."""
    name = {short: full for full, short in KV_DTYPE_SHORT.items()}.get(text, text)
    return name if name in KV_CACHE_DTYPES else None


def kv_dtype_tag(name: str) -> str:
    """A K/V element type's short name where it is not float32 (``bf16``), for the places that say
    it only then (the status line, the 80x24 KV bar, a race lane's title); "" for float32 or unknown."""
    return "" if name in ("", "float32") else KV_DTYPE_SHORT.get(name, name)


GREEDY_BELOW = 1e-5  # a temperature below this is greedy (vLLM's _SAMPLING_EPS)


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
        raise ContextTooLong(
            f"prompt is {prompt_len} tokens + max_new_tokens {max_new_tokens} = {need}, "
            f"more than {limit_name} of {limit} tokens; shorten the prompt or lower "
            f"max_new_tokens"
        )


class SamplingError(ValueError):
    """A sampling setting out of range; ``field`` names which one (an HTTP 400's ``param``)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Sampling:
    """How to pick tokens (the sampler's settings for one request; vLLM's meanings). Frozen:
    nothing changes a request's settings under it."""

    temperature: float = 0.0  # 0 (or below GREEDY_BELOW) = greedy
    top_k: int | None = None
    top_p: float | None = None
    min_p: float = 0.0  # drop tokens below min_p x the top token's probability (0 = off)
    presence_penalty: float = 0.0  # -2..2, subtracted once from each generated token's logit
    frequency_penalty: float = 0.0  # -2..2, subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # > 0 (1 = off): prompt and output tokens' logits / (or x) it
    seed: int | None = None  # its own random stream: draws independent of the batch

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not _finite(t) or t < 0:
            raise SamplingError("temperature", f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if self.top_k is not None and (not is_int(self.top_k) or self.top_k < 1):
            raise SamplingError("top_k", f"top_k must be an integer >= 1 or None (off), got {self.top_k!r}")
        p = self.top_p
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0):
            raise SamplingError("top_p", f"top_p must be a number in (0, 1] or None (off), got {p!r}")
        if not _number_in(self.min_p, 0.0, 1.0):
            raise SamplingError("min_p", f"min_p must be a number in [0, 1] (0 = off), got {_short(self.min_p)}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not _number_in(getattr(self, name), -2.0, 2.0):
                raise SamplingError(
                    name, f"{name} must be a number in [-2, 2] (0 = off), got {_short(getattr(self, name))}"
                )
        r = self.repetition_penalty
        if not _number_in(r, 0.0, math.inf) or r == 0:
            raise SamplingError(
                "repetition_penalty", f"repetition_penalty must be a finite number > 0 (1 = off), got {_short(r)}"
            )
        if self.seed is not None and (not is_int(self.seed) or not SEED_MIN <= self.seed <= SEED_MAX):
            raise SamplingError(
                "seed", f"seed must be an integer in [{SEED_MIN}, {SEED_MAX}] or None, got {_short(self.seed)}"
            )

    @property
    def penalized(self) -> bool:
        """Some penalty is on: the sampler needs this row's prompt and output tokens."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    def describe(self, full: bool = False) -> str:
        """``greedy`` / ``T=0.8 k=40``; ``full=True`` names every setting (``T=0.8 k=40 p=—``),
        for the app's settings line where a missing field would look like a bug."""
        k = None if self.top_k is None else str(self.top_k)
        p = None if self.top_p is None else f"{self.top_p:g}"
        parts = [f"T={self.temperature:g}"]
        parts += [f"{name}={v or '—'}" for name, v in (("k", k), ("p", p)) if full or v is not None]
        if is_greedy(self.temperature) and not full:
            parts = ["greedy"]
        extra = (
            ("minp", self.min_p, 0.0),
            ("pres", self.presence_penalty, 0.0),
            ("freq", self.frequency_penalty, 0.0),
            ("rep", self.repetition_penalty, 1.0),
        )
        parts += [f"{name}={v:g}" for name, v, off in extra if v != off]
        parts += [] if self.seed is None else [f"seed={self.seed}"]
        return " ".join(parts)


@dataclass(frozen=True)
class RequestSettings:
    """Everything a request asks for besides its prompt, as ONE object that travels whole from
    the prompt line, a workload file or an HTTP body to the engine's ``Request``."""

    sampling: Sampling = field(default_factory=Sampling)
    max_new_tokens: int = 100
    stop_at_eos: bool = True
    priority: int = 0
    tenant: str = ""
    stop: tuple[str, ...] = ()  # stop strings: matched on the text (tinyllm.stops), not by the engine
    stop_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0
    logprobs: int | None = None
    n: int = 1  # samples of the prompt (forks sharing its blocks: add_forks)

    def __post_init__(self):
        if not is_int(self.n) or not 1 <= self.n <= MAX_N:
            raise SamplingError("n", f"n must be an integer from 1 to {MAX_N}, got {_short(self.n)}")
        if not isinstance(self.sampling, Sampling):
            raise ValueError(f"sampling must be a Sampling, got {type(self.sampling).__name__}")
        if not is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        check_priority(self.priority)
        check_tenant(self.tenant)
        object.__setattr__(self, "stop", check_stop(self.stop))
        check_token_stops(self.stop_token_ids, self.min_tokens, self.max_new_tokens, self.logprobs)

    def describe(self) -> str:
        """``T=0.8 k=— p=— new=120 eos=on``: the app's next-request line (its stop strings as the
        settings dialog writes them, ``stop=the|\\n``, when it has any)."""
        from tinyllm.stops import format_stop_list  # (stops is the text side; no cycle at import)

        who = "".join(
            [
                f" stop={format_stop_list(self.stop)}" if self.stop else "",
                f" prio={self.priority}" if self.priority else "",
                f" tenant={self.tenant}" if self.tenant else "",
                f" n={self.n}" if self.n > 1 else "",
            ]
        )
        return f"{self.sampling.describe(full=True)} new={self.max_new_tokens} eos={'on' if self.stop_at_eos else 'off'}{who}"

    def request(self, prompt: list[int] | tuple[int, ...], eos_id: int | None) -> Request:
        """The engine's request for ``prompt`` (``eos_id``: the tokenizer's end of text)."""
        return Request(
            prompt,
            self.max_new_tokens,
            eos_id if self.stop_at_eos else None,
            self.sampling,
            self.priority,
            self.tenant,
            stop_token_ids=tuple(self.stop_token_ids),
            min_tokens=self.min_tokens,
            logprobs=self.logprobs,
        )


@dataclass
class Request:
    """What a caller asks for. The engine copies it on ``add_request`` (the prompt as a tuple),
    so changing the caller's list afterwards cannot bypass the checks made there."""

    prompt: list[int] | tuple[int, ...]
    max_new_tokens: int
    eos_id: int | None = None
    sampling: Sampling | None = None  # ContinuousEngine only; None = the engine's settings
    priority: int = 0  # the "priority" policy: lower runs first (vLLM's meaning)
    tenant: str = ""  # the "fair" policy shares the token budget between tenants
    stop_token_ids: tuple[int, ...] = ()  # more token ids that end it (finish reason "stop")
    min_tokens: int = 0  # EOS and stop_token_ids cannot end it (nor be drawn) before this many
    logprobs: int | None = None  # record each token's logprob and this many top alternatives

    def __post_init__(self):
        self.prompt = token_ids(self.prompt)
        check_priority(self.priority)
        check_tenant(self.tenant)
        if not isinstance(self.prompt, (list, tuple)) or not self.prompt:
            raise ValueError(f"prompt must be a non-empty list of token ids, got {_short(self.prompt)}")
        bad = next((t for t in self.prompt if not (is_int(t) and t >= 0)), None)
        if bad is not None:
            raise ValueError(f"prompt token ids must be integers >= 0, got {bad!r}")
        if not is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        check_token_stops(self.stop_token_ids, self.min_tokens, self.max_new_tokens, self.logprobs)
        if self.eos_id is not None and (not is_int(self.eos_id) or self.eos_id < 0):
            raise ValueError(f"eos_id must be an integer >= 0 or None, got {self.eos_id!r}")
        if self.sampling is not None and not isinstance(self.sampling, Sampling):
            raise ValueError(f"sampling must be a Sampling or None, got {type(self.sampling).__name__}")

    def frozen(self) -> Request:
        """A validated copy whose prompt is an immutable tuple (re-checks everything: the
        caller may have changed this request since it was built)."""
        prompt = tuple(self.prompt) if isinstance(self.prompt, (list, tuple)) else self.prompt
        stop_ids = tuple(self.stop_token_ids) if isinstance(self.stop_token_ids, (list, tuple)) else self.stop_token_ids
        return replace(self, prompt=prompt, stop_token_ids=stop_ids)

    def stop_ids(self) -> tuple[int, ...]:
        """The token ids that end it once min_tokens are out: its EOS (if any) and stop_token_ids."""
        return self.stop_token_ids if self.eos_id is None else (self.eos_id, *self.stop_token_ids)


MAX_STOPS = 16  # stop strings per request (OpenAI allows 4, vLLM any number)
MAX_STOP_CHARS = 256
MAX_LOGPROBS = 20  # top alternatives per token (vLLM's default max_logprobs)


def check_stop(stop) -> tuple[str, ...]:
    """Stop strings as a tuple (a lone string is one stop; empty strings are dropped: they
    would end every request at once). SamplingError("stop", ...) otherwise."""
    stops = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)) or not all(isinstance(x, str) for x in stops):
        raise SamplingError("stop", f"stop must be a string or a list of strings, got {_short(stop)}")
    stops = tuple(x for x in stops if x)
    if len(stops) > MAX_STOPS or any(len(x) > MAX_STOP_CHARS for x in stops):
        raise SamplingError(
            "stop",
            f"stop takes at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters each, got {_short(stop)}",
        )
    return stops


def check_token_stops(stop_token_ids, min_tokens, max_new_tokens: int | None, logprobs) -> None:
    """stop_token_ids, min_tokens and logprobs are in range; SamplingError naming the field.
    ``max_new_tokens`` None: not known yet (min_tokens is checked against it later)."""
    if (
        not isinstance(stop_token_ids, (list, tuple))
        or len(stop_token_ids) > 1024
        or not all(is_int(t) and t >= 0 for t in stop_token_ids)
    ):
        raise SamplingError(
            "stop_token_ids",
            f"stop_token_ids must be a list of at most 1024 token ids (integers >= 0), got {_short(stop_token_ids)}",
        )
    most = max_new_tokens if is_int(max_new_tokens) else math.inf if max_new_tokens is None else 0
    if not is_int(min_tokens) or not 0 <= min_tokens <= most:
        limit = "" if max_new_tokens is None else f" ({max_new_tokens!r})"
        raise SamplingError(
            "min_tokens", f"min_tokens must be an integer from 0 to max_tokens{limit}, got {_short(min_tokens)}"
        )
    if logprobs is not None and (not is_int(logprobs) or not 0 <= logprobs <= MAX_LOGPROBS):
        raise SamplingError(
            "logprobs", f"logprobs must be an integer from 0 to {MAX_LOGPROBS} or None, got {_short(logprobs)}"
        )


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability under the model (before temperature, penalties and cuts, as
    vLLM's default), its ``rank`` in that distribution (1: the most likely; vLLM's), and the
    ``top`` most likely tokens with theirs, best first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int = 1


PRIORITY_LIMIT = 2**31  # |priority| below this: fits every JSON reader and metric label
TENANT_MAX_CHARS = 64


def check_priority(priority) -> int:
    """A request's priority: an integer, lower first (vLLM's ``priority``); ValueError otherwise."""
    if not is_int(priority) or not -PRIORITY_LIMIT < priority < PRIORITY_LIMIT:
        raise ValueError(
            f"priority must be an integer in ({-PRIORITY_LIMIT}, {PRIORITY_LIMIT}) "
            f"(lower runs first), got {_short(priority)}"
        )
    return priority


def check_tenant(tenant) -> str:
    """A tenant name: up to TENANT_MAX_CHARS printable characters ("" = the default tenant)."""
    if not isinstance(tenant, str) or len(tenant) > TENANT_MAX_CHARS or not tenant.isprintable():
        raise ValueError(
            f"tenant must be a string of at most {TENANT_MAX_CHARS} printable characters, got {_short(tenant)}"
        )
    return tenant


SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # a seed fits an int64 (vLLM's range)
MAX_N = 16  # samples of one prompt per request (n)


def fork_sampling(sampling: Sampling, i: int) -> Sampling:
    """Sample ``i``'s settings of a request for n samples: a seeded request's sample i draws
    from seed + i (wrapping within int64, so no seed a client sends can fail here), so each
    sample equals the solo run with that seed; unseeded samples share the settings."""
    if sampling.seed is None or i == 0:
        return sampling
    return replace(sampling, seed=(sampling.seed + i - SEED_MIN) % 2**64 + SEED_MIN)


def _number_in(x, lo: float, hi: float) -> bool:
    """A finite int or float (not a bool) in [lo, hi]."""
    return not isinstance(x, bool) and isinstance(x, (int, float)) and _finite(x) and lo <= x <= hi


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
    """How a request ended: every request the engine took ends with one (``engine.results``),
    finished, aborted or failed."""

    tokens: list[int]  # generated tokens (EOS included if it was produced)
    ttft_s: float  # arrival → first generated token (nan: none was)
    latency_s: float  # arrival → its end
    rid: int = -1  # the engine's request id
    state: str = "finished"  # finished, aborted or failed
    finish_reason: str = "length"  # finished: eos, stop, length; else "abort" or "error"
    error: str | None = None  # failed: why
    logprobs: tuple[TokenLogprob, ...] = ()  # with Request(logprobs=k): one per token
