"""OpenAI's chat completions API as plain data: validate messages, build responses and chunks.

The sampling surface is the completions route's, parsed by the same ``parse_generation``, so
every sampling field either route learns works on both. What is chat's own: ``messages`` (each
``{"role", "content", "name"?}``; content a string or a list of text parts, which are joined
with newlines as vLLM does), vLLM's ``add_generation_prompt`` extension, ``max_completion_tokens``,
and the response shapes (``chat.completion``, ``chat.completion.chunk`` with ``delta``s, the
first of which carries the role).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from tinyllm.request import TokenLogprob
from tinyllm.serve.body import ApiError, bool_field, brief, check_object, text_field, type_name
from tinyllm.serve.completions import LOGPROB_FLOOR, Piece
from tinyllm.serve.protocol import GenerationParams, parse_generation

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True, kw_only=True)
class ChatParams(GenerationParams):
    """A validated chat request: the messages normalised to ``{"role", "content": str, "name"?}``."""

    messages: tuple[dict[str, str], ...]
    add_generation_prompt: bool = True


def parse_chat(body: Any, served_model: str) -> ChatParams:
    """Validate a decoded JSON body. Raises ApiError (400) naming the bad param."""
    check_object(body)
    shared = parse_generation(body, served_model, chat=True)
    if body.get("chat_template") is not None:
        raise ApiError(
            "chat_template is not supported: this server renders the model's own template",
            "chat_template",
            "unsupported_parameter",
        )
    agp = body.get("add_generation_prompt")
    return ChatParams(
        **shared,
        messages=parse_messages(body.get("messages", _MISSING)),
        add_generation_prompt=True if agp is None else bool_field(body, "add_generation_prompt"),
    )


_MISSING = object()


def parse_messages(messages: Any) -> tuple[dict[str, str], ...]:
    """The conversation, each message checked and its content flattened to text."""
    if messages is _MISSING or messages is None:
        raise ApiError("you must provide messages", "messages", "missing_required_parameter")
    if not isinstance(messages, list):
        raise ApiError(
            f"messages must be an array of message objects, got {type_name(messages)}", "messages", "invalid_type"
        )
    if not messages:
        raise ApiError("messages is empty: give at least one message", "messages", "invalid_value")
    return tuple(_message(m, f"messages[{i}]") for i, m in enumerate(messages))


def _message(m: Any, where: str) -> dict[str, str]:
    if not isinstance(m, dict):
        raise ApiError(f"{where} must be an object with a role and content, got {type_name(m)}", where, "invalid_type")
    role = m.get("role")
    if role is None:
        raise ApiError(
            f"{where} has no role (one of {', '.join(ROLES)})", f"{where}.role", "missing_required_parameter"
        )
    if not isinstance(role, str):
        raise ApiError(f"{where}.role must be a string, got {type_name(role)}", f"{where}.role", "invalid_type")
    if role not in ROLES:
        raise ApiError(
            f"{where}.role {brief(role)} is not a role: use one of {', '.join(ROLES)}", f"{where}.role", "invalid_value"
        )
    content = m.get("content")
    if content is None and role == "assistant":
        content = ""  # OpenAI: an assistant turn may carry no text
    out = {"role": role, "content": _content(content, f"{where}.content")}
    name = m.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise ApiError(f"{where}.name must be a string, got {type_name(name)}", f"{where}.name", "invalid_type")
        out["name"] = text_field(name, f"{where}.name")
    return out


def _content(c: Any, where: str) -> str:
    """A string, or a list of ``{"type": "text", "text": str}`` parts (joined with newlines)."""
    if isinstance(c, str):
        return text_field(c, where)
    if c is None:
        raise ApiError(
            f"{where} is missing: give a string or a list of text parts", where, "missing_required_parameter"
        )
    if not isinstance(c, list):
        raise ApiError(f"{where} must be a string or a list of text parts, got {type_name(c)}", where, "invalid_type")
    texts = []
    for i, part in enumerate(c):
        at = f"{where}[{i}]"
        if not isinstance(part, dict):
            raise ApiError(
                f'{at} must be a {{"type": "text", "text": ...}} object, got {type_name(part)}', at, "invalid_type"
            )
        if part.get("type") != "text":
            raise ApiError(
                f'{at} has type {brief(part.get("type"))}: this model reads text only (parts of type "text")',
                f"{at}.type",
                "invalid_value",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise ApiError(f"{at}.text must be a string, got {type_name(text)}", f"{at}.text", "invalid_type")
        texts.append(text_field(text, f"{at}.text"))
    return "\n".join(texts)


# -- responses --------------------------------------------------------------------------------
def chat_logprobs(lps: list[TokenLogprob], token_text, top_n: int) -> dict:
    """OpenAI's chat ``logprobs`` object (``logprobs: true``, ``top_logprobs: top_n``): per token
    its text, logprob and UTF-8 bytes, and its ``top_n`` best alternatives likewise."""

    def entry(tok: int, lp: float) -> dict:
        text = token_text(tok)
        return {"token": text, "logprob": max(lp, LOGPROB_FLOOR), "bytes": list(text.encode("utf-8", "replace"))}

    return {
        "content": [
            dict(entry(lp.token, lp.logprob), top_logprobs=[entry(t, v) for t, v in lp.top[:top_n]]) for lp in lps
        ]
    }


class ChatShape:
    """How chat answers look: the shapes ``/v1/completions`` uses, with chat's objects."""

    @staticmethod
    def new_id() -> str:
        return f"chatcmpl-{uuid.uuid4().hex}"

    @staticmethod
    def response(cid: str, model: str, piece: Piece, usage_: dict, logprobs: dict | None = None) -> dict:
        choice: dict = {
            "index": 0,
            "message": {"role": "assistant", "content": piece.text},
            "logprobs": logprobs,
            "finish_reason": piece.finish_reason,
        }
        out = {
            "id": cid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": usage_,
        }
        if piece.token_ids is not None:
            choice["token_ids"], out["prompt_token_ids"] = piece.token_ids, piece.prompt_ids
        return out

    @staticmethod
    def first_chunk(cid: str, created: int, model: str, include_usage: bool) -> dict | None:
        """The stream opens with the assistant's role and no text, as OpenAI's does."""
        return ChatShape.chunk(cid, created, model, Piece("", None), include_usage, role=True)

    @staticmethod
    def chunk(
        cid: str,
        created: int,
        model: str,
        piece: Piece,
        include_usage: bool,
        role: bool = False,
        logprobs: dict | None = None,
    ) -> dict:
        text = piece.text
        # A token whose text is not out yet still gets its chunk ({"content": ""}, as vLLM: a
        # client times every token); the last chunk's delta is empty when it brings no text.
        delta: dict = (
            {"role": "assistant", "content": text}
            if role
            else ({"content": text} if text or piece.finish_reason is None else {})
        )
        choice: dict = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": piece.finish_reason}
        if piece.token_ids is not None:
            choice["token_ids"] = piece.token_ids
        out = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}
        if piece.prompt_ids is not None:
            out["prompt_token_ids"] = piece.prompt_ids
        if include_usage:
            out["usage"] = None
        return out

    @staticmethod
    def usage_chunk(cid: str, created: int, model: str, usage_: dict) -> dict:
        return {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage_,
        }
