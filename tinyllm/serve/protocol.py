"""The OpenAI completions API's requests as plain data: ``parse_completion`` validates a body,
and ``parse_generation`` is the one parser of the fields completions and chat share
(tinyllm/serve/chat.py calls it too). Responses are built in ``completions.py``, the JSON body
and its errors read in ``body.py``, the context checked in ``fit.py``.

No web framework here: parsing is hand-written so every problem becomes OpenAI's error shape
with the offending ``param`` (a schema library's messages would not be), and sampling values go
through ``Sampling``'s own checks, the same rule the engine and the CLI apply.

Supported: ``model``, ``prompt`` (a string, a list of token ids, or a list holding one of
those), ``max_tokens`` (default 16), ``temperature`` (default 1, OpenAI's), ``top_p``,
``top_k`` (extension; 0 or -1 = off, as in vLLM), ``min_p``, ``presence_penalty``,
``frequency_penalty``, ``repetition_penalty``, ``seed``, ``stop``, ``stop_token_ids``,
``min_tokens``, ``logprobs`` (completions: 0..20), ``n`` (1..16 samples of the prompt, computed
once: the engine's forks), ``stream``, ``stream_options.include_usage``, ``ignore_eos`` and
``return_token_ids`` (vLLM's extensions), ``priority`` (vLLM's), ``user`` (the fair policy's
tenant), ``echo`` (completions: the prompt comes back before the completion, with its logprobs
when ``logprobs`` is set; ``max_tokens: 0`` with it scores the prompt and generates nothing, the
request evaluation harnesses make). Rejected with a 400 when set to anything but their no-op
value: ``best_of`` (1), ``suffix``, ``logit_bias``. Any other unknown field is refused with a 400 naming it
(and the known field it looks like).
"""

from __future__ import annotations

import difflib
import hashlib
import math
from dataclasses import dataclass
from typing import Any

from tinyllm.request import (
    MAX_LOGPROBS,
    MAX_N,
    TENANT_MAX_CHARS,
    Sampling,
    SamplingError,
    check_priority,
    check_stop,
    check_token_stops,
    is_int,
)
from tinyllm.serve.body import (
    ApiError,
    bool_field,
    brief,
    check_object,
    got,
    number_field,
    parse_model,
    request_error,
    text_field,
    type_name,
)

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default


@dataclass(frozen=True, kw_only=True)
class GenerationParams:
    """What /v1/completions and /v1/chat/completions share: the model, how many tokens, how to
    sample, how to answer. ``parse_generation`` fills every field for both routes, so a field
    added here (and there) works on both at once."""

    model: str
    max_tokens: int | None  # None (chat only): whatever the context leaves
    max_tokens_field: str | None = "max_tokens"  # the field max_tokens came in (errors name it); None: not sent (chat)
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False
    return_token_ids: bool = False
    stop: tuple[str, ...] = ()  # stop strings (matched on the text: tinyllm.stops)
    stop_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0
    logprobs: int | None = None  # completions: the chosen token's logprob and this many alternatives
    priority: int = 0  # vLLM's field: the "priority" policy runs lower values first
    tenant: str = ""  # the "fair" policy's tenant: OpenAI's "user" (else the API key's)
    n: int = 1  # samples of the prompt (choices 0..n-1; seeded: sample i uses seed + i)


@dataclass(frozen=True, kw_only=True)
class CompletionParams(GenerationParams):
    """A validated completions request (the prompt not yet tokenized when it is text)."""

    prompt_text: str | None  # exactly one of prompt_text / prompt_ids is set
    prompt_ids: tuple[int, ...] | None
    echo: bool = False  # the prompt (and its logprobs) before the completion; max_tokens 0: only it


# Known OpenAI fields this server does not implement: each is accepted only at its no-op value
# (or left out). Chat's refusals: tools would need a template and a parser for tool calls.
_NO_OP = {
    "best_of": 1,
    "suffix": "",
    "logit_bias": {},
    "tools": [],
    "tool_choice": "none",
    "response_format": {"type": "text"},
    "continue_final_message": False,
}
_UNSUPPORTED = ("best_of", "suffix", "logit_bias")
_UNSUPPORTED_CHAT = ("logit_bias", "tools", "tool_choice", "response_format", "continue_final_message")
_WHY = {"best_of": " (it returns all n samples, it does not pick the best of several)"}


# Every field a request may carry: what the parsers read, the unimplemented ones (refused unless at
# their no-op value), and OpenAI's bookkeeping fields, which change nothing here. Anything else is
# refused, as OpenAI does ("Unrecognized request argument"): `max_token` ran at the default 16.
_SHARED_FIELDS = frozenset(
    {
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "seed",
        "stop",
        "stop_token_ids",
        "min_tokens",
        "logprobs",
        "n",
        "stream",
        "stream_options",
        "ignore_eos",
        "return_token_ids",
        "priority",
        "user",
        "metadata",
        "store",
        "service_tier",
    }
)
_FIELDS = {
    False: _SHARED_FIELDS | {"prompt", "echo", *_UNSUPPORTED},
    True: _SHARED_FIELDS
    | {
        "messages",
        "max_completion_tokens",
        "top_logprobs",
        "add_generation_prompt",
        "chat_template",
        "parallel_tool_calls",
        *_UNSUPPORTED_CHAT,
    },
}


def _check_fields(body: dict, chat: bool) -> None:
    """A field this route does not know is a 400 naming it (and the known one it looks like)."""
    known = _FIELDS[chat]
    # a suggestion is a field this route takes (not one refused by name later: chat_template_kwargs
    # suggested chat_template) and close to the name (reasoning_effort suggested response_format)
    takes = known - {*_UNSUPPORTED, *_UNSUPPORTED_CHAT, "chat_template"}
    for name in body:
        if name not in known:
            near = difflib.get_close_matches(str(name), sorted(takes), n=1, cutoff=0.75)
            other = {"messages": "/v1/chat/completions", "prompt": "/v1/completions"}.get(name)
            hint = (
                f"{name} goes to {other}"
                if other
                else f"did you mean {near[0]!r}?"
                if near
                else f"this route takes {', '.join(sorted(takes - {'metadata', 'store', 'service_tier'}))}"
            )
            raise ApiError(
                f"unrecognized request argument {brief(name)}: {hint}", str(name)[:64], "unrecognized_parameter"
            )


def _check_unsupported(body: dict, names: tuple[str, ...]) -> None:
    """Refuse an unsupported field set to anything but its no-op value (same JSON type: true is not 1)."""
    for name in names:
        v, no_op = body.get(name), _NO_OP[name]
        if v is not None and not (type(v) is type(no_op) and v == no_op):
            raise ApiError(
                f"{name} is not supported by this server{_WHY.get(name, '')}: leave it out or send "
                f"{brief(no_op)}, got {brief(v)}",
                name,
                "unsupported_parameter",
            )


def parse_prompt(p: Any) -> str | tuple[int, ...]:
    """The prompt as text or token ids; a list of several prompts is a clear 400."""
    if (
        isinstance(p, list)
        and len(p) > 1
        and (all(isinstance(x, str) for x in p) or all(isinstance(x, list) for x in p))
    ):
        raise ApiError(
            f"prompt holds a batch of {len(p)} prompts; this server takes one prompt per "
            "request: send them as separate requests",
            "prompt",
            "invalid_value",
        )
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str):
        return text_field(p, "prompt")
    if isinstance(p, list):
        if not p:
            raise ApiError("prompt is empty: give text or a non-empty list of token ids", "prompt", "invalid_value")
        bad = next((x for x in p if not is_int(x) or x < 0), None)
        if bad is not None:
            raise ApiError(f"prompt token ids must be integers >= 0, got {brief(bad)}", "prompt", "invalid_value")
        return tuple(p)
    if p is None:
        raise ApiError("you must provide a prompt", "prompt", "missing_required_parameter")
    raise ApiError(
        f"prompt must be a string, a list of token ids, or a list holding one of those; got {type_name(p)}",
        "prompt",
        "invalid_type",
    )


def parse_completion(body: Any, served_model: str) -> CompletionParams:
    """Validate a decoded JSON body. Raises ApiError (400) naming the bad param."""
    check_object(body)
    shared = parse_generation(body, served_model)
    if "prompt" not in body:
        raise ApiError("you must provide a prompt", "prompt", "missing_required_parameter")
    prompt = parse_prompt(body["prompt"])
    return CompletionParams(
        **shared,
        prompt_text=prompt if isinstance(prompt, str) else None,
        prompt_ids=prompt if isinstance(prompt, tuple) else None,
        echo=bool_field(body, "echo"),
    )


def _max_tokens(body: dict, chat: bool) -> tuple[int | None, str | None]:
    """``max_tokens`` (chat: or OpenAI's newer ``max_completion_tokens``) and the field's name, so
    a later error names the field the client used; the default is 16 for completions (OpenAI's),
    None for chat (what the context leaves, as OpenAI and vLLM: no field to name)."""
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(name)
    if max_tokens is None:
        return (None, None) if chat else (DEFAULT_MAX_TOKENS, name)
    if not is_int(max_tokens):
        raise ApiError(f"{name} must be an integer, got {got(max_tokens)}", name, "invalid_type")
    if max_tokens == 0 and not chat and body.get("echo") is True:
        return 0, name  # echo only: the prompt scored, nothing generated (OpenAI's legacy completions)
    if max_tokens < 1:
        hint = "" if chat or max_tokens != 0 else " (0 only with echo: true, which returns the prompt alone)"
        raise ApiError(f"{name} must be at least 1{hint}, got {brief(max_tokens)}", name, "invalid_value")
    return max_tokens, name


_INTEGER_FIELDS = (
    "max_tokens",
    "max_completion_tokens",
    "top_k",
    "n",
    "seed",
    "min_tokens",
    "priority",
    "top_logprobs",
)


def _whole_numbers_as_integers(body: dict, chat: bool) -> None:
    """An integer field given a whole number written as a float (``"max_tokens": 16.0``, what some
    clients' JSON encoders write) is that integer, as vLLM's request models take it; ``1.5`` is
    still refused, quoted."""
    for name in _INTEGER_FIELDS + (() if chat else ("logprobs",)):  # (chat's logprobs: a boolean)
        v = body.get(name)
        if isinstance(v, float) and v.is_integer() and abs(v) <= 2**53:
            body[name] = int(v)


def parse_generation(body: dict, served_model: str, chat: bool = False) -> dict[str, Any]:
    """The fields both routes share (GenerationParams' fields, as keyword arguments), validated:
    the model, max_tokens, sampling, streaming, and the refusals of what is not implemented.
    The one place these are parsed, so completions and chat accept exactly the same sampling
    surface. Where the routes' shapes differ (``logprobs``: an integer on completions, a boolean
    plus ``top_logprobs`` on chat) ``chat`` says which shape to read."""
    _check_fields(body, chat)
    _whole_numbers_as_integers(body, chat)
    model = parse_model(body, served_model)
    max_tokens, max_tokens_field = _max_tokens(body, chat)
    temperature = number_field(body, "temperature")
    temperature = DEFAULT_TEMPERATURE if temperature is None else temperature
    if isinstance(temperature, float) and not math.isfinite(temperature):
        raise ApiError(f"temperature must be finite, got {brief(body['temperature'])}", "temperature", "invalid_value")
    top_p = number_field(body, "top_p")
    top_k = body.get("top_k")
    if top_k is not None and not is_int(top_k):
        raise ApiError(f"top_k must be an integer, got {got(top_k)}", "top_k", "invalid_type")
    if top_k is not None and top_k < -1:  # vLLM's convention: 0 and -1 are "off" too
        raise ApiError(
            f"top_k must be an integer >= 1, or 0 / -1 / null for no limit, got {brief(top_k)}",
            "top_k",
            "invalid_value",
        )
    try:
        sampling = Sampling(
            temperature, None if top_k in (0, -1) else top_k, top_p, **_sampling_extras(body)
        )  # its error names the field
        stops = _stop_fields(body, max_tokens, chat)
    except SamplingError as e:
        raise request_error(e, e.field, body) from None
    stream = bool_field(body, "stream")
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not stream:
            raise ApiError("stream_options can only be set when stream is true", "stream_options", "invalid_value")
        if not isinstance(opts, dict):
            raise ApiError(f"stream_options must be an object, got {type_name(opts)}", "stream_options", "invalid_type")
        include_usage = bool_field(opts, "include_usage", "stream_options.include_usage")
    _check_unsupported(body, _UNSUPPORTED_CHAT if chat else _UNSUPPORTED)
    return dict(
        model=model,
        max_tokens=max_tokens,
        max_tokens_field=max_tokens_field,
        sampling=sampling,
        stream=stream,
        include_usage=include_usage,
        ignore_eos=bool_field(body, "ignore_eos"),
        return_token_ids=bool_field(body, "return_token_ids"),
        priority=_priority(body),
        tenant=tenant_of(body.get("user"), "user"),
        n=_n(body),
        **stops,
    )


def _n(body: dict) -> int:
    """OpenAI's ``n``: how many samples of the prompt to return, 1..MAX_N (default 1)."""
    v = body.get("n")
    if v is None:
        return 1
    if not is_int(v):
        raise ApiError(f"n must be an integer, got {got(v)}", "n", "invalid_type")
    if not 1 <= v <= MAX_N:
        raise ApiError(f"n must be from 1 to {MAX_N}, got {brief(v)}", "n", "invalid_value")
    return v


def _priority(body: dict) -> int:
    """vLLM's ``priority``: an integer, lower runs first under --scheduling-policy priority."""
    v = body.get("priority", 0)
    if v is None:
        return 0
    try:
        return check_priority(v)
    except ValueError as e:
        raise request_error(e, "priority", body, "invalid_value" if is_int(v) else "invalid_type") from None


def api_key_tenant(authorization: str | None) -> str:
    """The fair policy's tenant for a request without ``user``: its API key (``Authorization:
    Bearer KEY``), as a short digest (a key is never shown), or "" without one."""
    if not authorization:
        return ""
    key = authorization.removeprefix("Bearer ").strip()
    return "key:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:8] if key else ""


def tenant_of(who: Any, param: str) -> str:
    """A tenant name for the fair policy from OpenAI's ``user`` (any string; a long or odd one is
    shortened to a stable digest, so nothing a client sends can fail later), or ""."""
    if who is None:
        return ""
    if not isinstance(who, str):
        raise ApiError(f"{param} must be a string, got {type_name(who)}", param, "invalid_type")
    if len(who) <= TENANT_MAX_CHARS and who.isprintable():
        return who
    return "user:" + hashlib.sha256(who.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def _sampling_extras(body: dict) -> dict[str, Any]:
    """min_p, the three penalties and seed, type-checked here; their ranges are Sampling's."""
    out: dict[str, Any] = {}
    for name in ("min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
        v = number_field(body, name)
        if v is not None:
            out[name] = v
    seed = body.get("seed")
    if seed is not None and not is_int(seed):
        raise ApiError(f"seed must be an integer, got {got(seed)}", "seed", "invalid_type")
    out["seed"] = seed
    return out


def _chat_logprobs(body: dict) -> int | None:
    """Chat's logprobs shape, as the one count completions use: ``logprobs: true`` turns them on,
    ``top_logprobs`` (0..20, default 0) says how many alternatives each token gets."""
    on, top = body.get("logprobs"), body.get("top_logprobs")
    if on is not None and not isinstance(on, bool):
        raise ApiError(
            f"logprobs must be a boolean on chat completions (top_logprobs says how many), got {type_name(on)}",
            "logprobs",
            "invalid_type",
        )
    if top is not None and not (is_int(top) and 0 <= top <= MAX_LOGPROBS):
        raise ApiError(
            f"top_logprobs must be an integer from 0 to {MAX_LOGPROBS}, got {brief(top)}",
            "top_logprobs",
            "invalid_value",
        )
    if top and not on:
        raise ApiError("top_logprobs needs logprobs: true", "top_logprobs", "invalid_value")
    return (top or 0) if on else None


def _stop_fields(body: dict, max_tokens: int | None, chat: bool) -> dict[str, Any]:
    """stop, stop_token_ids, min_tokens and (completions) logprobs, checked by the rules the
    engine's Request applies (SamplingError naming the field)."""
    stop = check_stop(() if body.get("stop") is None else body["stop"])
    for i, x in enumerate(stop):  # a lone surrogate in a stop string: a 400, as in any text field
        text_field(x, "stop" if isinstance(body["stop"], str) else f"stop[{i}]")
    ids = body.get("stop_token_ids")
    ids = () if ids is None else ids
    min_tokens = body.get("min_tokens")
    min_tokens = 0 if min_tokens is None else min_tokens
    logprobs = _chat_logprobs(body) if chat else body.get("logprobs")
    check_token_stops(ids, min_tokens, max_tokens, logprobs)  # chat without max_tokens: checked later
    return dict(stop=stop, stop_token_ids=tuple(ids), min_tokens=min_tokens, logprobs=logprobs)
