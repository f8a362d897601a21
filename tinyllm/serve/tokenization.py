"""vLLM's ``/tokenize`` and ``/detokenize``: request parsing and response shapes.

Shapes as in vLLM (``vllm/entrypoints/openai/protocol.py``): ``/tokenize`` takes either
``{"prompt": str, "add_special_tokens": true}`` or ``{"messages": [...], "add_generation_prompt":
true, "add_special_tokens": false}`` (the messages rendered with the chat template, exactly as
``/v1/chat/completions`` renders them), plus ``return_token_strs``; it answers ``{"count",
"max_model_len", "tokens", "token_strs"}``. ``/detokenize`` takes ``{"tokens": [ids]}`` and
answers ``{"prompt": text}``. ``model`` is optional on both and checked when given.

``max_token_bytes`` bounds how much text one token can stand for, so the generation routes can
refuse a prompt too long for the context before spending seconds tokenizing it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tokenizers.pre_tokenizers import ByteLevel

from tinyllm.request import is_int
from tinyllm.serve.body import ApiError, bool_field, brief, check_object, parse_model, text_field, type_name
from tinyllm.serve.chat import parse_messages


@dataclass(frozen=True)
class TokenizeParams:
    prompt: str | None  # exactly one of prompt / messages
    messages: tuple[dict[str, str], ...] | None
    add_special_tokens: bool
    add_generation_prompt: bool
    return_token_strs: bool


def _flag(body: dict, name: str, default: bool) -> bool:
    return default if body.get(name) is None else bool_field(body, name)


def parse_tokenize(body: Any, served_model: str) -> TokenizeParams:
    """Validate a /tokenize body. Raises ApiError (400)."""
    check_object(body)
    parse_model(body, served_model)
    has_prompt, has_messages = body.get("prompt") is not None, body.get("messages") is not None
    if has_prompt == has_messages:
        raise ApiError(
            "give exactly one of prompt (text) or messages (a chat)",
            "prompt" if has_prompt else "messages",
            "invalid_value" if has_prompt else "missing_required_parameter",
        )
    strs = _flag(body, "return_token_strs", False)
    if has_prompt:
        p = body["prompt"]
        if not isinstance(p, str):
            raise ApiError(f"prompt must be a string, got {type_name(p)}", "prompt", "invalid_type")
        return TokenizeParams(text_field(p, "prompt"), None, _flag(body, "add_special_tokens", True), False, strs)
    if _flag(body, "continue_final_message", False):
        raise ApiError(
            "continue_final_message is not supported: the template renders whole messages",
            "continue_final_message",
            "unsupported_parameter",
        )
    return TokenizeParams(
        None,
        parse_messages(body["messages"]),
        _flag(body, "add_special_tokens", False),
        _flag(body, "add_generation_prompt", True),
        strs,
    )


def parse_detokenize(body: Any, served_model: str, vocab_size: int, max_tokens: int | None = None) -> list[int]:
    """The token ids of a /detokenize body (at most ``max_tokens``), each inside the vocabulary.
    Raises ApiError (400)."""
    check_object(body)
    parse_model(body, served_model)
    toks = body.get("tokens")
    if toks is None:
        raise ApiError("you must provide tokens (a list of token ids)", "tokens", "missing_required_parameter")
    if not isinstance(toks, list):
        raise ApiError(f"tokens must be a list of token ids, got {type_name(toks)}", "tokens", "invalid_type")
    if max_tokens is not None and len(toks) > max_tokens:
        raise ApiError(
            f"tokens has {len(toks)} ids, more than the server's limit of {max_tokens} for /detokenize",
            "tokens",
            "too_many_tokens",
        )
    bad = next((t for t in toks if not is_int(t) or not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ApiError(f"tokens must be token ids in [0, {vocab_size}), got {brief(bad)}", "tokens", "invalid_value")
    return toks


def tokenize_response(ids: list[int], max_model_len: int, token_strs: list[str] | None) -> dict:
    out: dict = {"count": len(ids), "max_model_len": max_model_len, "tokens": ids}
    if token_strs is not None:
        out["token_strs"] = token_strs
    return out


# What may run before the BPE model without dropping or shrinking text (a token then covers at most
# its own vocabulary string's bytes): Whitespace or NFC would drop or merge characters, so a
# tokenizer with anything else gets no bound.
_KEEPS_TEXT = {"ByteLevel", "Metaspace", "Digits", "Split", "Punctuation", "Prepend", "Replace"}


def max_token_bytes(tokenizer) -> int | None:
    """The most UTF-8 bytes of prompt text one token can stand for: its vocabulary's longest
    string (at least 4: an unknown character becomes one unknown token). None where no such
    bound holds: not a BPE model; a character that can become no token (dropped) or share one
    with others (fused unknowns); a normalizer or pre-tokenizer that drops or shrinks text;
    truncation; an added token that swallows the spaces around it."""
    hf = getattr(tokenizer, "hf", None)
    try:
        cfg = json.loads(hf.to_str())
        vocab = hf.get_vocab(with_added_tokens=True)
    except Exception:  # noqa: BLE001 - a tokenizer that cannot say: no bound
        return None
    model, pre = cfg.get("model") or {}, _steps(cfg.get("pre_tokenizer"))
    byte_level = any(s.get("type") == "ByteLevel" for s in pre) and set(ByteLevel.alphabet()) <= vocab.keys()
    each_char_a_token = (
        model.get("byte_fallback") or byte_level or (model.get("unk_token") is not None and not model.get("fuse_unk"))
    )
    if (
        model.get("type") != "BPE"
        or not each_char_a_token
        or cfg.get("truncation") is not None
        or any(t.get("lstrip") or t.get("rstrip") for t in cfg.get("added_tokens") or [])
        or not all(_keeps_text(s) for s in _steps(cfg.get("normalizer")) + pre)
    ):
        return None
    return max(4, max(len(s.encode("utf-8")) for s in vocab))


def _steps(step: dict | None) -> list[dict]:
    """A normalizer's or pre-tokenizer's steps, its Sequences flattened."""
    if step is None:
        return []
    if step.get("type") == "Sequence":
        return [s for sub in step.get("normalizers") or step.get("pretokenizers") or [] for s in _steps(sub)]
    return [step]


def _keeps_text(step: dict) -> bool:
    """A normalizer or pre-tokenizer step that never drops or shrinks text."""
    if step.get("type") == "Replace":  # e.g. Llama 2's " " -> "\u2581": grows, fine
        pattern = step.get("pattern") or {}
        return "String" in pattern and len(step.get("content", "").encode()) >= len(pattern["String"].encode())
    return step.get("type") in _KEEPS_TEXT and step.get("behavior") != "Removed"
