"""Does a prompt fit: the model's vocabulary, its context, and what the KV pool holds for one
request, checked before the engine sees it so the client gets OpenAI's 400."""

from __future__ import annotations

from tinyllm.serve.body import ApiError


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
