"""vLLM's ``/tokenize`` and ``/detokenize``: request parsing and response shapes.

Shapes as in vLLM (``vllm/entrypoints/openai/protocol.py``): ``/tokenize`` takes either
``{"prompt": str, "add_special_tokens": true}`` or ``{"messages": [...], "add_generation_prompt":
true, "add_special_tokens": false}`` (the messages rendered with the chat template, exactly as
``/v1/chat/completions`` renders them), plus ``return_token_strs``; it answers ``{"count",
"max_model_len", "tokens", "token_strs"}``. ``/detokenize`` takes ``{"tokens": [ids]}`` and
answers ``{"prompt": text}``. ``model`` is optional on both and checked when given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tinyllm.request import is_int
from tinyllm.serve.chat import parse_messages
from tinyllm.serve.protocol import ApiError, _bool, _text, _type_name, brief, check_object, parse_model


@dataclass(frozen=True)
class TokenizeParams:
    prompt: str | None                              # exactly one of prompt / messages
    messages: tuple[dict[str, str], ...] | None
    add_special_tokens: bool
    add_generation_prompt: bool
    return_token_strs: bool


def _flag(body: dict, name: str, default: bool) -> bool:
    return default if body.get(name) is None else _bool(body, name)


def parse_tokenize(body: Any, served_model: str) -> TokenizeParams:
    """Validate a /tokenize body. Raises ApiError (400)."""
    check_object(body)
    parse_model(body, served_model)
    has_prompt, has_messages = body.get("prompt") is not None, body.get("messages") is not None
    if has_prompt == has_messages:
        raise ApiError("give exactly one of prompt (text) or messages (a chat)", "prompt" if has_prompt else
                       "messages", "invalid_value" if has_prompt else "missing_required_parameter")
    strs = _flag(body, "return_token_strs", False)
    if has_prompt:
        p = body["prompt"]
        if not isinstance(p, str):
            raise ApiError(f"prompt must be a string, got {_type_name(p)}", "prompt", "invalid_type")
        return TokenizeParams(_text(p, "prompt"), None, _flag(body, "add_special_tokens", True), False, strs)
    if _flag(body, "continue_final_message", False):
        raise ApiError("continue_final_message is not supported: the template renders whole messages",
                       "continue_final_message", "unsupported_parameter")
    return TokenizeParams(None, parse_messages(body["messages"]), _flag(body, "add_special_tokens", False),
                          _flag(body, "add_generation_prompt", True), strs)


def parse_detokenize(body: Any, served_model: str, vocab_size: int) -> list[int]:
    """The token ids of a /detokenize body, each inside the vocabulary. Raises ApiError (400)."""
    check_object(body)
    parse_model(body, served_model)
    toks = body.get("tokens")
    if toks is None:
        raise ApiError("you must provide tokens (a list of token ids)", "tokens", "missing_required_parameter")
    if not isinstance(toks, list):
        raise ApiError(f"tokens must be a list of token ids, got {_type_name(toks)}", "tokens", "invalid_type")
    bad = next((t for t in toks if not is_int(t) or not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ApiError(f"tokens must be token ids in [0, {vocab_size}), got {brief(bad)}", "tokens", "invalid_value")
    return toks


def tokenize_response(ids: list[int], max_model_len: int, token_strs: list[str] | None) -> dict:
    out: dict = {"count": len(ids), "max_model_len": max_model_len, "tokens": ids}
    if token_strs is not None:
        out["token_strs"] = token_strs
    return out
