"""The OpenAI completions API as plain data: parse a request body, build responses and chunks.

No web framework here: parsing is hand-written so every problem becomes OpenAI's error shape
with the offending ``param`` (a schema library's messages would not be), and sampling values go
through ``Sampling``'s own checks, the same rule the engine and the CLI apply.

Supported: ``model``, ``prompt`` (a string, a list of token ids, or a list holding one of
those), ``max_tokens`` (default 16), ``temperature`` (default 1, OpenAI's), ``top_p``,
``top_k`` (extension; 0 or -1 = off, as in vLLM), ``stream``, ``stream_options.include_usage``,
``ignore_eos`` and ``return_token_ids`` (vLLM's extensions), ``user`` (ignored). Rejected with
a 400 when set to anything but their no-op value: ``n``/``best_of`` (1), ``echo``, ``logprobs``,
``stop``, ``suffix``, ``presence_penalty``/``frequency_penalty`` (0), ``logit_bias``, and
``seed``: the engine draws every request's samples from one shared generator, so a per-request
seed could not make a completion reproducible. Other unknown fields are ignored, as vLLM does.

Every body goes through ``load_json`` first, which turns what Python's json module raises or
accepts but nothing downstream can use (nesting deep enough to exhaust the stack, integers too
long to convert) into 400s that say what and where; text fields must be valid Unicode (JSON lets
a ``\\udfff`` escape stand alone; the tokenizer and the response encoder do not).
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from tinyllm.request import ContextTooLong, Sampling, SamplingError, check_fits, is_int

DEFAULT_MAX_TOKENS = 16                 # OpenAI's default for completions
DEFAULT_TEMPERATURE = 1.0               # OpenAI's default
MAX_JSON_DEPTH = 64                     # arrays/objects inside each other; a real body needs 3


class ApiError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {message, type, param, code}}``."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.type = message, param, code, status, type

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# -- the body as JSON ----------------------------------------------------------------------------
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]|\d+')     # strings whole, brackets, digit runs


def load_json(raw: bytes) -> Any:
    """The request body decoded, or an ApiError (400) naming what is wrong and where."""
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")
        body = json.loads(text)
    except UnicodeDecodeError as e:
        raise ApiError(f"the request body is not valid JSON: {e}", None, "invalid_json") from None
    except RecursionError:                                # json recurses once per level
        raise _too_deep(text) from None
    except json.JSONDecodeError as e:
        raise ApiError(f"the request body is not valid JSON: {e}", None, "invalid_json") from None
    except ValueError:                                    # an integer longer than int() converts
        limit = sys.get_int_max_str_digits()
        pos, field = _locate(text, lambda tok, depth: tok.isdigit() and len(tok) > limit)
        raise ApiError(f"the request body has an integer of more than {limit} digits{_at(text, pos, field)}, "
                       "longer than this server reads", field, "invalid_value") from None
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _deeper_than(body, MAX_JSON_DEPTH):
        raise _too_deep(text)                             # (the counts: a cheap "cannot be too deep")
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
    return ApiError(f"the request body is nested too deep: more than {MAX_JSON_DEPTH} arrays/objects inside "
                    f"each other{_at(text, pos, field)}", field, "invalid_value")


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
                field = key                               # the top-level key just before this value
        elif tok in ("]", "}"):
            depth -= 1
        elif tok[0] == '"' and depth == 1 and top == "{":
            key = tok                                     # keys and values alternate: a key precedes its value
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
    """repr(v), cut to ``limit`` characters: an error message quotes what the client sent, not all of it."""
    r = repr(v)
    return r if len(r) <= limit else r[:limit - 3] + "..."


def _text(s: str, param: str) -> str:
    """``s`` if it is valid Unicode text; a lone surrogate (JSON allows ``\\udfff`` alone) is a 400."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(f"{param} is not valid Unicode text: it holds a lone surrogate U+{ord(s[e.start]):04X} at "
                       f"character {e.start} (a \\ud800-\\udfff escape must be half of a pair)", param,
                       "invalid_value") from None
    return s


@dataclass(frozen=True)
class CompletionParams:
    """A validated completions request (the prompt not yet tokenized when it is text)."""
    model: str
    prompt_text: str | None             # exactly one of prompt_text / prompt_ids is set
    prompt_ids: tuple[int, ...] | None
    max_tokens: int
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False
    return_token_ids: bool = False


# Known OpenAI fields this server does not implement: each is accepted only at its no-op value.
_UNSUPPORTED = ("n", "best_of", "echo", "logprobs", "stop", "suffix", "presence_penalty", "frequency_penalty",
                "logit_bias", "seed")
_WHY = {"seed": "the engine samples every request from one shared generator, so a per-request seed "
                "cannot make a completion reproducible; use temperature 0 for deterministic output",
        "n": "one completion per request", "best_of": "one completion per request"}


def _type_name(v: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object",
            type(None): "null"}.get(type(v), type(v).__name__)


def _number(body: dict, name: str) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ApiError(f"{name} must be a number, got {_type_name(v)}", name, "invalid_type")
    try:
        return float(v)
    except OverflowError:                                 # an int of hundreds of digits
        raise ApiError(f"{name} is too large: an integer of {len(str(abs(v)))} digits", name,
                       "invalid_value") from None


def _bool(body: dict, name: str, where: str | None = None) -> bool:
    v = body.get(name)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ApiError(f"{name} must be a boolean, got {_type_name(v)}", where or name, "invalid_type")
    return v


def _is_no_op(name: str, v: Any) -> bool:
    """An unsupported field left at the value that changes nothing."""
    if v is None:
        return True
    if name in ("n", "best_of"):
        return is_int(v) and v == 1
    if name in ("presence_penalty", "frequency_penalty"):
        return not isinstance(v, bool) and isinstance(v, (int, float)) and v == 0
    return {"echo": v is False, "stop": v in ("", []), "suffix": v == "", "logit_bias": v == {}}.get(name, False)


def parse_prompt(p: Any) -> str | tuple[int, ...]:
    """The prompt as text or token ids; a list of several prompts is a clear 400."""
    if isinstance(p, list) and len(p) > 1 and (all(isinstance(x, str) for x in p)
                                               or all(isinstance(x, list) for x in p)):
        raise ApiError(f"prompt holds a batch of {len(p)} prompts; this server takes one prompt per "
                       "request: send them as separate requests", "prompt", "invalid_value")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]                                          # a batch of one
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
    raise ApiError(f"prompt must be a string, a list of token ids, or a list holding one of those; got "
                   f"{_type_name(p)}", "prompt", "invalid_type")


def parse_completion(body: Any, served_model: str) -> CompletionParams:
    """Validate a decoded JSON body. Raises ApiError (400) naming the bad param."""
    if not isinstance(body, dict):
        raise ApiError(f"the request body must be a JSON object, got {_type_name(body)}", None, "invalid_type")
    model = body.get("model")
    if model is None:
        model = served_model                              # as vLLM: the one model this server has
    if not isinstance(model, str):
        raise ApiError(f"model must be a string, got {_type_name(model)}", "model", "invalid_type")
    if _text(model, "model") != served_model:
        raise ApiError(f"The model `{model[:200]}` does not exist. This server serves `{served_model}` "
                       "(see GET /v1/models).", "model", "model_not_found")
    if "prompt" not in body:
        raise ApiError("you must provide a prompt", "prompt", "missing_required_parameter")
    prompt = parse_prompt(body["prompt"])
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    elif not is_int(max_tokens):
        raise ApiError(f"max_tokens must be an integer, got {_type_name(max_tokens)}", "max_tokens", "invalid_type")
    elif max_tokens < 1:
        raise ApiError(f"max_tokens must be at least 1, got {brief(max_tokens)}", "max_tokens", "invalid_value")
    temperature = _number(body, "temperature")
    temperature = DEFAULT_TEMPERATURE if temperature is None else temperature
    if isinstance(temperature, float) and not math.isfinite(temperature):
        raise ApiError(f"temperature must be finite, got {temperature}", "temperature", "invalid_value")
    top_p = _number(body, "top_p")
    top_k = body.get("top_k")
    if top_k is not None and is_int(top_k) and top_k in (0, -1):
        top_k = None                                      # vLLM's "off"
    if top_k is not None and not is_int(top_k):
        raise ApiError(f"top_k must be an integer, got {_type_name(top_k)}", "top_k", "invalid_type")
    try:
        sampling = Sampling(temperature, top_k, top_p)        # its error names the field
    except SamplingError as e:
        raise ApiError(str(e), e.field, "invalid_value") from None
    stream = _bool(body, "stream")
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not stream:
            raise ApiError("stream_options can only be set when stream is true", "stream_options", "invalid_value")
        if not isinstance(opts, dict):
            raise ApiError(f"stream_options must be an object, got {_type_name(opts)}", "stream_options",
                           "invalid_type")
        include_usage = _bool(opts, "include_usage", "stream_options.include_usage")
    for name in _UNSUPPORTED:
        v = body.get(name)
        if not _is_no_op(name, v):
            why = _WHY.get(name, "not supported by this server")
            raise ApiError(f"{name}={brief(v)} is not supported: {why}", name, "unsupported_parameter")
    return CompletionParams(model, prompt if isinstance(prompt, str) else None,
                            prompt if isinstance(prompt, tuple) else None, max_tokens, sampling, stream,
                            include_usage, _bool(body, "ignore_eos"), _bool(body, "return_token_ids"))


def check_prompt(ids: list[int] | tuple[int, ...], max_tokens: int, vocab_size: int, max_len: int) -> None:
    """The prompt fits the vocabulary and the server's context (the engine re-checks on
    add_request, the pool's size included). Raises ApiError."""
    if not ids:
        raise ApiError("prompt is empty: it encodes to no tokens", "prompt", "invalid_value")
    bad = next((t for t in ids if t >= vocab_size), None)
    if bad is not None:
        raise ApiError(f"prompt token id {bad} is outside the model's vocabulary [0, {vocab_size})", "prompt",
                       "invalid_value")
    try:
        check_fits(len(ids), max_tokens, max_len, "the server's context")
    except ContextTooLong:
        raise ApiError(f"This model's maximum context length is {max_len} tokens. However, you requested "
                       f"{len(ids) + max_tokens} tokens ({len(ids)} in your prompt; {max_tokens} for the "
                       "completion). Please reduce your prompt or max_tokens.", "prompt",
                       "context_length_exceeded") from None


# -- responses --------------------------------------------------------------------------------
def new_completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def completion(cid: str, model: str, text: str, finish_reason: str, usage_: dict,
               token_ids: list[int] | None = None, prompt_ids: list[int] | None = None) -> dict:
    choice: dict = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    if token_ids is not None:
        choice["prompt_token_ids"], choice["token_ids"] = prompt_ids, token_ids
    return {"id": cid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [choice], "usage": usage_}


def chunk(cid: str, created: int, model: str, text: str, finish_reason: str | None, include_usage: bool,
          token_ids: list[int] | None = None, prompt_ids: list[int] | None = None) -> dict:
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


def usage_chunk(cid: str, created: int, model: str, usage_: dict) -> dict:
    """The stream's last data chunk when stream_options.include_usage: no choices, the usage."""
    return {"id": cid, "object": "text_completion", "created": created, "model": model, "choices": [],
            "usage": usage_}
