"""Render chat messages to a prompt with the checkpoint's own ``chat_template``, as Hugging Face does.

A chat template is Jinja code shipped in ``tokenizer_config.json`` by whoever made the model, so
it is rendered in jinja2's ``ImmutableSandboxedEnvironment`` (no attribute access to Python
internals, no mutating the messages) with the same environment transformers builds in
``apply_chat_template``: ``trim_blocks``/``lstrip_blocks``, the ``loopcontrols`` extension, a
``tojson`` filter that keeps non-ASCII text, and the globals ``raise_exception`` (a template's
way to refuse a conversation) and ``strftime_now``; the variables are ``messages``,
``add_generation_prompt`` and the special tokens (``bos_token``, ``eos_token``, ...). So a
checkpoint's template renders here exactly as it does in transformers and vLLM.

Every failure (no template, a template that does not compile, one that raises while rendering,
``raise_exception`` included) is a ``ChatTemplateError`` the server answers with a 400.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_RENDERED_CHARS = 1_000_000  # a template looping on itself stops here, not at memory's end


class ChatTemplateError(ValueError):
    """No template, or it could not render these messages: the message says which and why."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"the chat template refused these messages: {message}")


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def compile_template(source: str) -> jinja2.Template:
    """The template compiled once (checkpoints have one; tests a few). Raises ChatTemplateError."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"the model's chat template does not compile: {e}") from None


def render(
    source: str | None,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    special_tokens: dict[str, str | None] | None = None,
) -> str:
    """``messages`` rendered by the template ``source`` (None: this checkpoint has none)."""
    if not source:
        raise ChatTemplateError(
            'this model has no chat template (tokenizer_config.json has no "chat_template"), '
            "so it cannot take chat messages: use /v1/completions with a prompt"
        )
    template = compile_template(source)
    try:
        tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}  # unset: undefined, as HF
        out = template.render(messages=messages, add_generation_prompt=add_generation_prompt, **tokens)
    except ChatTemplateError:
        raise
    except RecursionError:
        raise ChatTemplateError("the chat template recursed too deep rendering these messages") from None
    except Exception as e:  # noqa: BLE001 - a template's bug is the request's 400
        raise ChatTemplateError(f"the chat template failed on these messages: {type(e).__name__}: {e}") from None
    if len(out) > MAX_RENDERED_CHARS:
        raise ChatTemplateError(
            f"the chat template rendered {len(out)} characters, more than {MAX_RENDERED_CHARS} this server takes"
        )
    return out
