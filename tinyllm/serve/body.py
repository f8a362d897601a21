"""A request body as JSON, the errors answered in OpenAI's shape, and the typed field readers
every route shares (completions, chat, tokenize).

Every body goes through ``load_json`` first, which turns what Python's json module raises or
accepts but nothing downstream can use (nesting deep enough to exhaust the stack, integers too
long to convert) into 400s that say what and where; text fields must be valid Unicode (JSON lets
a ``\\udfff`` escape stand alone; the tokenizer and the response encoder do not).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Callable
from typing import Any

MAX_JSON_DEPTH = 64  # arrays/objects inside each other; a real body needs 3
MAX_JSON_CONTAINERS = 10_000  # arrays/objects in one body; a chat of 1,000 messages needs ~2,000


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
    """OpenAI's error shape. Its texts are made valid Unicode: one may quote what the client sent
    (a field's name with a lone surrogate, JSON's \\ud800) and the response must still encode
    (it was a 500, and the client's connection dropped)."""
    return {"error": {"message": _text(message), "type": type, "param": _text(param), "code": code}}


def _text(s: str | None) -> str | None:
    return None if s is None else s.encode("utf-8", "backslashreplace").decode("utf-8")


_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]|\d+')  # strings whole, brackets, digit runs


def load_json(raw: bytes) -> Any:
    """The request body decoded, or an ApiError (400) naming what is wrong and where. A body of
    more than MAX_JSON_CONTAINERS arrays/objects is refused before it is parsed: parsing runs on
    the event loop and holds Python's lock, and a 1 MiB ``[[],[],...]`` took 0.6 s to parse and
    2 s to walk while every other client (``/health`` included) waited."""
    _check_containers(raw)
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


INLINE_JSON_BYTES = 1 << 16  # a body up to this is parsed on the event loop; a larger one in a thread


async def read_json(raw: bytes) -> Any:
    """``load_json(raw)``, a large body in a worker thread: its parsing then gives the event loop
    (``/health``, every other client) its turn between its steps instead of holding it throughout."""
    if len(raw) <= INLINE_JSON_BYTES:
        return load_json(raw)
    return await asyncio.to_thread(load_json, raw)


def _check_containers(raw: bytes) -> None:
    """Refuse a body of more than MAX_JSON_CONTAINERS arrays/objects, counted without parsing:
    brackets in bytes (C speed), and only when those are too many, again outside strings."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_CONTAINERS:
        return
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")  # escaped backslashes, then quotes
    bare = b"".join(unescaped.split(b'"')[::2])  # what lies outside strings
    n = bare.count(b"[") + bare.count(b"{")
    if n > MAX_JSON_CONTAINERS:
        raise ApiError(
            f"the request body holds {n} arrays/objects, more than the {MAX_JSON_CONTAINERS} this server reads "
            "in one request",
            None,
            "invalid_value",
        )


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


def text_field(s: str, param: str) -> str:
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


def got(v: Any) -> str:
    """What a field that must be an integer got: a number quoted as sent (``1.5``, not "number",
    which did not say what was wrong with it), anything else by its JSON type."""
    return brief(v) if isinstance(v, float) else type_name(v)


def type_name(v: Any) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
        type(None): "null",
    }.get(type(v), type(v).__name__)


def number_field(body: dict, name: str) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ApiError(f"{name} must be a number, got {type_name(v)}", name, "invalid_type")
    try:
        return float(v)
    except OverflowError:  # an int of hundreds of digits
        raise ApiError(f"{name} is too large: an integer of {len(str(abs(v)))} digits", name, "invalid_value") from None


def bool_field(body: dict, name: str, where: str | None = None) -> bool:
    v = body.get(name)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ApiError(f"{name} must be a boolean, got {type_name(v)}", where or name, "invalid_type")
    return v


def check_object(body: Any) -> dict:
    """``body`` if it is a JSON object; else a 400."""
    if not isinstance(body, dict):
        raise ApiError(f"the request body must be a JSON object, got {type_name(body)}", None, "invalid_type")
    return body


def parse_model(body: dict, served_model: str) -> str:
    """The ``model`` field: absent means the one model this server has (as vLLM)."""
    model = body.get("model")
    if model is None:
        model = served_model  # as vLLM: the one model this server has
    if not isinstance(model, str):
        raise ApiError(f"model must be a string, got {type_name(model)}", "model", "invalid_type")
    if text_field(model, "model") != served_model:
        raise ApiError(
            f"The model `{model[:200]}` does not exist. This server serves `{served_model}` (see GET /v1/models).",
            "model",
            "model_not_found",
        )
    return model
