"""The OpenAI completions API as plain data: parse a request body, build responses and chunks.
``parse_generation`` is the one parser of the fields completions and chat share (tinyllm/serve/chat.py
calls it too).

No web framework here: parsing is hand-written so every problem becomes OpenAI's error shape
with the offending ``param`` (a schema library's messages would not be), and sampling values go
through ``Sampling``'s own checks, the same rule the engine and the CLI apply.

Supported: ``model``, ``prompt`` (a string, a list of token ids, or a list holding one of
those), ``max_tokens`` (default 16), ``temperature`` (default 1, OpenAI's), ``top_p``,
``top_k`` (extension; 0 or -1 = off, as in vLLM), ``min_p``, ``presence_penalty``,
``frequency_penalty``, ``repetition_penalty``, ``seed``, ``stop``, ``stop_token_ids``,
``min_tokens``, ``logprobs`` (completions: 0..20), ``n`` (1..16 samples of the prompt, computed
once: the engine's forks), ``stream``, ``stream_options.include_usage``, ``ignore_eos`` and
``return_token_ids`` (vLLM's extensions), ``user`` (ignored). Rejected with a 400 when set to
anything but their no-op value: ``best_of`` (1), ``echo``, ``suffix``, ``logit_bias``. Other unknown fields are ignored, as vLLM does.

Every body goes through ``load_json`` first, which turns what Python's json module raises or
accepts but nothing downstream can use (nesting deep enough to exhaust the stack, integers too
long to convert) into 400s that say what and where; text fields must be valid Unicode (JSON lets
a ``\\udfff`` escape stand alone; the tokenizer and the response encoder do not).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tinyllm.request import (
    MAX_LOGPROBS,
    MAX_N,
    TENANT_MAX_CHARS,
    Sampling,
    SamplingError,
    TokenLogprob,
    check_priority,
    check_stop,
    check_token_stops,
    is_int,
)

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default
MAX_JSON_DEPTH = 64  # arrays/objects inside each other; a real body needs 3


class ApiError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {message, type, param, code}}``."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        code: str | None = None,
        status: int = 400,
        type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.type = message, param, code, status, type
        self.headers = headers

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str, type: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# -- the body as JSON ----------------------------------------------------------------------------
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]|\d+')  # strings whole, brackets, digit runs


def load_json(raw: bytes) -> Any:
    """The request body decoded, or an ApiError (400) naming what is wrong and where."""
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")
        body = json.loads(text)
    except UnicodeDecodeError as e:
        raise ApiError(f"the request body is not valid JSON: {e}", None, "invalid_json") from None
    except RecursionError:  # json recurses once per level
        raise _too_deep(text) from None
    except json.JSONDecodeError as e:
        raise ApiError(f"the request body is not valid JSON: {e}", None, "invalid_json") from None
    except ValueError:  # an integer longer than int() converts
        limit = sys.get_int_max_str_digits()
        pos, field = _locate(text, lambda tok, depth: tok.isdigit() and len(tok) > limit)
        raise ApiError(
            f"the request body has an integer of more than {limit} digits{_at(text, pos, field)}, "
            "longer than this server reads",
            field,
            "invalid_value",
        ) from None
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _deeper_than(body, MAX_JSON_DEPTH):
        raise _too_deep(text)  # (the counts: a cheap "cannot be too deep")
    return body


def _deeper_than(v: Any, limit: int) -> bool:
    """More than ``limit`` arrays/objects inside each other (iterative: no recursion to exhaust)."""
    stack = [(v, 1)] if isinstance(v, (list, dict)) else []
    while stack:
        x, depth = stack.pop()
        if depth > limit:
            return True
        items = x.values() if isinstance(x, dict) else x
        stack.extend((y, depth + 1) for y in items if isinstance(y, (list, dict)))
    return False


def _too_deep(text: str) -> ApiError:
    pos, field = _locate(text, lambda tok, depth: tok in ("[", "{") and depth > MAX_JSON_DEPTH)
    return ApiError(
        f"the request body is nested too deep: more than {MAX_JSON_DEPTH} arrays/objects inside "
        f"each other{_at(text, pos, field)}",
        field,
        "invalid_value",
    )


def _locate(text: str, hit: Callable[[str, int], bool]) -> tuple[int | None, str | None]:
    """Where in the JSON ``text`` the first token ``hit(token, depth)`` is: its offset and the
    top-level field it sits in (only run to word an error, so speed does not matter)."""
    depth, key, field, top = 0, None, None, None
    for m in _TOKENS.finditer(text):
        tok = m.group()
        if tok in ("[", "{"):
            depth += 1
            top = top or tok
            if depth == 2:
                field = key  # the top-level key just before this value
        elif tok in ("]", "}"):
            depth -= 1
        elif tok[0] == '"' and depth == 1 and top == "{":
            key = tok  # keys and values alternate: a key precedes its value
        if hit(tok, depth):
            name = field if depth >= 2 else key
            try:
                name = json.loads(name) if name is not None else None
            except ValueError:
                pass
            return m.start(), name if isinstance(name, str) else None
    return None, None


def _at(text: str, pos: int | None, field: str | None) -> str:
    """`` (line 1 column 12, in "prompt")`` for an error message; empty when unknown."""
    if pos is None:
        return ""
    line, col = text.count("\n", 0, pos) + 1, pos - text.rfind("\n", 0, pos)
    return f" (line {line} column {col}" + (f", in {brief(field)}" if field is not None else "") + ")"


def brief(v: Any, limit: int = 60) -> str:
    """``v`` as the JSON the client sent (``null``, ``true``, ``0``, ``["a", ...``), cut to ``limit``
    characters: an error message quotes what the client sent, in its terms, not all of it."""
    if isinstance(v, (str, list, tuple)):
        v = v[:limit]  # longer is cut below anyway: do not encode it all
    r = json.dumps(v, default=repr)  # ASCII-escaped: a lone surrogate stays printable
    return r if len(r) <= limit else r[: limit - 3] + "..."


def request_error(e: ValueError, field: str, body: dict | None = None, code: str = "invalid_value") -> ApiError:
    """A refusal by tinyllm.request's checks (worded for Python callers, ending ", got VALUE") as a
    JSON client reads it: null for None, and the value as the client sent it (``body[field]``:
    ``0``, not the ``0.0`` the server made of it; ``true``, not ``True``)."""
    head, got, value = str(e).rpartition(", got ")
    if not got:
        head, value = value, ""
    if body is not None and field in body:
        value = brief(body[field])
    return ApiError(re.sub(r"\bNone\b", "null", head) + (f", got {value}" if got else ""), field, code)


def _text(s: str, param: str) -> str:
    """``s`` if it is valid Unicode text; a lone surrogate (JSON allows ``\\udfff`` alone) is a 400."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(
            f"{param} is not valid Unicode text: it holds a lone surrogate U+{ord(s[e.start]):04X} at "
            f"character {e.start} (a \\ud800-\\udfff escape must be half of a pair)",
            param,
            "invalid_value",
        ) from None
    return s


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


# Known OpenAI fields this server does not implement: each is accepted only at its no-op value
# (or left out). Chat's refusals: tools would need a template and a parser for tool calls.
_NO_OP = {
    "best_of": 1,
    "echo": False,
    "suffix": "",
    "logit_bias": {},
    "tools": [],
    "tool_choice": "none",
    "response_format": {"type": "text"},
    "continue_final_message": False,
}
_UNSUPPORTED = ("best_of", "echo", "suffix", "logit_bias")
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
    False: _SHARED_FIELDS | {"prompt", *_UNSUPPORTED},
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
    for name in body:
        if name not in known:
            near = difflib.get_close_matches(str(name), sorted(known), n=1, cutoff=0.6)
            other = {"messages": "/v1/chat/completions", "prompt": "/v1/completions"}.get(name)
            hint = (
                f"{name} goes to {other}"
                if other
                else f"did you mean {near[0]!r}?"
                if near
                else f"this route takes {', '.join(sorted(known - {'metadata', 'store', 'service_tier'}))}"
            )
            raise ApiError(
                f"unrecognized request argument {brief(name)}: {hint}", str(name)[:64], "unrecognized_parameter"
            )


def _type_name(v: Any) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
        type(None): "null",
    }.get(type(v), type(v).__name__)


def _number(body: dict, name: str) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ApiError(f"{name} must be a number, got {_type_name(v)}", name, "invalid_type")
    try:
        return float(v)
    except OverflowError:  # an int of hundreds of digits
        raise ApiError(f"{name} is too large: an integer of {len(str(abs(v)))} digits", name, "invalid_value") from None


def _bool(body: dict, name: str, where: str | None = None) -> bool:
    v = body.get(name)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ApiError(f"{name} must be a boolean, got {_type_name(v)}", where or name, "invalid_type")
    return v


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
        return _text(p, "prompt")
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
        f"prompt must be a string, a list of token ids, or a list holding one of those; got {_type_name(p)}",
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
    )


def check_object(body: Any) -> dict:
    """``body`` if it is a JSON object; else a 400."""
    if not isinstance(body, dict):
        raise ApiError(f"the request body must be a JSON object, got {_type_name(body)}", None, "invalid_type")
    return body


def parse_model(body: dict, served_model: str) -> str:
    """The ``model`` field: absent means the one model this server has (as vLLM)."""
    model = body.get("model")
    if model is None:
        model = served_model  # as vLLM: the one model this server has
    if not isinstance(model, str):
        raise ApiError(f"model must be a string, got {_type_name(model)}", "model", "invalid_type")
    if _text(model, "model") != served_model:
        raise ApiError(
            f"The model `{model[:200]}` does not exist. This server serves `{served_model}` (see GET /v1/models).",
            "model",
            "model_not_found",
        )
    return model


def _max_tokens(body: dict, chat: bool) -> tuple[int | None, str | None]:
    """``max_tokens`` (chat: or OpenAI's newer ``max_completion_tokens``) and the field's name, so
    a later error names the field the client used; the default is 16 for completions (OpenAI's),
    None for chat (what the context leaves, as OpenAI and vLLM: no field to name)."""
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(name)
    if max_tokens is None:
        return (None, None) if chat else (DEFAULT_MAX_TOKENS, name)
    if not is_int(max_tokens):
        raise ApiError(f"{name} must be an integer, got {_type_name(max_tokens)}", name, "invalid_type")
    if max_tokens < 1:
        raise ApiError(f"{name} must be at least 1, got {brief(max_tokens)}", name, "invalid_value")
    return max_tokens, name


def parse_generation(body: dict, served_model: str, chat: bool = False) -> dict[str, Any]:
    """The fields both routes share (GenerationParams' fields, as keyword arguments), validated:
    the model, max_tokens, sampling, streaming, and the refusals of what is not implemented.
    The one place these are parsed, so completions and chat accept exactly the same sampling
    surface. Where the routes' shapes differ (``logprobs``: an integer on completions, a boolean
    plus ``top_logprobs`` on chat) ``chat`` says which shape to read."""
    _check_fields(body, chat)
    model = parse_model(body, served_model)
    max_tokens, max_tokens_field = _max_tokens(body, chat)
    temperature = _number(body, "temperature")
    temperature = DEFAULT_TEMPERATURE if temperature is None else temperature
    if isinstance(temperature, float) and not math.isfinite(temperature):
        raise ApiError(f"temperature must be finite, got {brief(body['temperature'])}", "temperature", "invalid_value")
    top_p = _number(body, "top_p")
    top_k = body.get("top_k")
    if top_k is not None and not is_int(top_k):
        raise ApiError(f"top_k must be an integer, got {_type_name(top_k)}", "top_k", "invalid_type")
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
    stream = _bool(body, "stream")
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not stream:
            raise ApiError("stream_options can only be set when stream is true", "stream_options", "invalid_value")
        if not isinstance(opts, dict):
            raise ApiError(
                f"stream_options must be an object, got {_type_name(opts)}", "stream_options", "invalid_type"
            )
        include_usage = _bool(opts, "include_usage", "stream_options.include_usage")
    _check_unsupported(body, _UNSUPPORTED_CHAT if chat else _UNSUPPORTED)
    return dict(
        model=model,
        max_tokens=max_tokens,
        max_tokens_field=max_tokens_field,
        sampling=sampling,
        stream=stream,
        include_usage=include_usage,
        ignore_eos=_bool(body, "ignore_eos"),
        return_token_ids=_bool(body, "return_token_ids"),
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
        raise ApiError(f"n must be an integer, got {_type_name(v)}", "n", "invalid_type")
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
        raise ApiError(f"{param} must be a string, got {_type_name(who)}", param, "invalid_type")
    if len(who) <= TENANT_MAX_CHARS and who.isprintable():
        return who
    return "user:" + hashlib.sha256(who.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def _sampling_extras(body: dict) -> dict[str, Any]:
    """min_p, the three penalties and seed, type-checked here; their ranges are Sampling's."""
    out: dict[str, Any] = {}
    for name in ("min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
        v = _number(body, name)
        if v is not None:
            out[name] = v
    seed = body.get("seed")
    if seed is not None and not is_int(seed):
        raise ApiError(f"seed must be an integer, got {_type_name(seed)}", "seed", "invalid_type")
    out["seed"] = seed
    return out


def _chat_logprobs(body: dict) -> int | None:
    """Chat's logprobs shape, as the one count completions use: ``logprobs: true`` turns them on,
    ``top_logprobs`` (0..20, default 0) says how many alternatives each token gets."""
    on, top = body.get("logprobs"), body.get("top_logprobs")
    if on is not None and not isinstance(on, bool):
        raise ApiError(
            f"logprobs must be a boolean on chat completions (top_logprobs says how many), got {_type_name(on)}",
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
    ids = body.get("stop_token_ids")
    ids = () if ids is None else ids
    min_tokens = body.get("min_tokens")
    min_tokens = 0 if min_tokens is None else min_tokens
    logprobs = _chat_logprobs(body) if chat else body.get("logprobs")
    check_token_stops(ids, min_tokens, max_tokens, logprobs)  # chat without max_tokens: checked later
    return dict(stop=stop, stop_token_ids=tuple(ids), min_tokens=min_tokens, logprobs=logprobs)


def check_prompt(
    ids: list[int] | tuple[int, ...],
    max_tokens: int,
    vocab_size: int,
    max_len: int,
    room: int | None = None,
    field: str | None = "max_tokens",
) -> None:
    """The prompt fits the vocabulary and one request's context (``check_context``; ``room``
    defaults to ``max_len``). The engine re-checks on add_request. Raises ApiError."""
    if not ids:
        raise ApiError("prompt is empty: it encodes to no tokens", "prompt", "invalid_value")
    bad = next((t for t in ids if t >= vocab_size), None)
    if bad is not None:
        raise ApiError(
            f"prompt token id {bad} is outside the model's vocabulary [0, {vocab_size})", "prompt", "invalid_value"
        )
    check_context(len(ids), max_tokens, max_len, max_len if room is None else room, field=field)


def check_text_fits(
    text: str, token_bytes: int | None, max_tokens: int, max_len: int, room: int, field: str | None = "max_tokens"
) -> None:
    """Refuse a prompt text too long to fit however it tokenizes, before tokenizing it (megabytes
    take seconds): no token covers more than ``token_bytes`` bytes of text (None: no such bound
    is known, nothing to check), so the prompt is at least bytes / token_bytes tokens."""
    if token_bytes is not None:
        at_least = -(-len(text.encode("utf-8")) // token_bytes)
        check_context(at_least, max_tokens, max_len, room, at_least=True, field=field)


def check_context(
    prompt_tokens: int,
    max_tokens: int,
    max_len: int,
    room: int,
    at_least: bool = False,
    field: str | None = "max_tokens",
) -> None:
    """prompt + max_tokens fit the model's context (tinyllm.request's ``check_fits`` rule) and what
    the KV pool holds for one request (``room``; the engine would refuse more). ``at_least``: the
    prompt's count is a lower bound (not tokenized), so only a prompt too long on its own is
    refused here; otherwise the tokenized count decides, and the 400 gives the real count.
    ``field``: the completion budget's field as the client sent it (None: the server chose the
    budget); the 400's ``param`` is the prompt when it alone does not fit, else that field.
    Raises ApiError (context_length_exceeded)."""
    at = "at least " if at_least else ""
    for limit, holds in (
        (max_len, f"This model's maximum context length is {max_len} tokens"),
        (room, f"This server's KV cache holds at most {room} tokens for one request"),
    ):
        if prompt_tokens + max_tokens <= limit:
            continue
        prompt_fits = prompt_tokens < limit  # with at least one completion token
        if at_least and prompt_fits:
            continue  # a bound from the bytes: tokenize, then count
        if field is None:  # the server's own budget: only the prompt is at fault
            asked = f"your prompt has {at}{prompt_tokens} tokens, which leaves no room for the completion"
        else:
            asked = (
                f"you requested {at}{prompt_tokens + max_tokens} tokens ({at}{prompt_tokens} in your prompt; "
                f"{max_tokens} for the completion)"
            )
        also = f" and {field}" if field and max_tokens >= limit else ""  # too long on its own, too
        raise ApiError(
            f"{holds}. However, {asked}. Please reduce {field if prompt_fits else 'your prompt' + also}.",
            field if prompt_fits else "prompt",
            "context_length_exceeded",
        )


# -- responses --------------------------------------------------------------------------------
def new_completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def completion(
    cid: str,
    model: str,
    text: str,
    finish_reason: str,
    usage_: dict,
    token_ids: list[int] | None = None,
    prompt_ids: list[int] | None = None,
) -> dict:
    choice: dict = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    if token_ids is not None:
        choice["prompt_token_ids"], choice["token_ids"] = prompt_ids, token_ids
    return {
        "id": cid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage_,
    }


def chunk(
    cid: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None,
    include_usage: bool,
    token_ids: list[int] | None = None,
    prompt_ids: list[int] | None = None,
) -> dict:
    """One streamed piece; ``usage`` is null on every chunk but the last when include_usage."""
    choice: dict = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    if token_ids is not None:
        choice["token_ids"] = token_ids
        if prompt_ids is not None:
            choice["prompt_token_ids"] = prompt_ids
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
