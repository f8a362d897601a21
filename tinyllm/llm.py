"""``tinyllm.LLM``: text in, text out, in one call (vLLM's and nano-vllm's ``LLM(...).generate``).

    from tinyllm import LLM, SamplingParams
    llm = LLM()                                  # the bundled model, the engine's best path
    out = llm.generate(["ROMEO:\\n"], SamplingParams(temperature=0.8, max_tokens=60, seed=1))
    print(out[0].text)

Under it is the step API (``llm.engine`` is a ContinuousEngine): every prompt is a Request,
added at once and stepped to the end; stop strings are matched on the detokenized text (the one
matcher the server uses) and end their request in the engine at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tinyllm.config import EngineConfig
from tinyllm.request import MAX_N, RequestSettings, Sampling, SamplingError, TokenLogprob, is_int
from tinyllm.stops import StopText


def SamplingParams(
    *,
    n: int = 1,
    max_tokens: int = 16,
    temperature: float = 1.0,
    top_p: float = 1.0,  # noqa: N802
    top_k: int = 0,
    min_p: float = 0.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    repetition_penalty: float = 1.0,
    seed: int | None = None,
    stop: str | Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    ignore_eos: bool = False,
    min_tokens: int = 0,
    logprobs: int | None = None,
    priority: int = 0,
    tenant: str = "",
) -> RequestSettings:
    """Every per-request setting, by vLLM's ``SamplingParams`` names and defaults (``max_tokens``
    16, ``temperature`` 1.0; ``top_k`` 0 or -1 and ``top_p`` 1.0 mean off). Returns the engine's
    one settings object, ``RequestSettings``, which the server, the app's settings dialog and
    prompt files build too. A value out of range is a ValueError naming the field given here."""
    if not is_int(max_tokens) or max_tokens < 1:
        raise SamplingError("max_tokens", f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    if not is_int(top_k) or top_k < -1:
        raise SamplingError("top_k", f"top_k must be an integer >= 1, or 0 / -1 for no limit, got {top_k!r}")
    if not isinstance(ignore_eos, bool):
        raise SamplingError("ignore_eos", f"ignore_eos must be True or False, got {ignore_eos!r}")
    sampling = Sampling(
        temperature,
        top_k if top_k > 0 else None,
        None if top_p == 1.0 else top_p,
        min_p,
        presence_penalty,
        frequency_penalty,
        repetition_penalty,
        seed,
    )
    stop_ids = tuple(stop_token_ids) if isinstance(stop_token_ids, (list, tuple)) else stop_token_ids
    return RequestSettings(
        sampling, max_tokens, not ignore_eos, priority, tenant, stop, stop_ids, min_tokens, logprobs, n
    )


@dataclass(frozen=True)
class Completion:
    """One sample of a prompt (vLLM's ``CompletionOutput``)."""

    index: int  # which of the prompt's n samples
    text: str  # detokenized, stop string excluded
    token_ids: tuple[int, ...]
    finish_reason: str  # "stop" (EOS, a stop token or string), "length", "abort", "error"
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    logprobs: tuple[TokenLogprob, ...] | None = None  # with SamplingParams(logprobs=k)
    ttft_s: float = float("nan")
    latency_s: float = float("nan")


@dataclass(frozen=True)
class Generation:
    """A prompt and its samples (vLLM's ``RequestOutput``); ``text``, ``token_ids``,
    ``finish_reason`` and ``logprobs`` are the first sample's."""

    prompt: str | None  # None when the prompt was given as token ids
    prompt_token_ids: tuple[int, ...]
    outputs: tuple[Completion, ...]

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str:
        return self.outputs[0].finish_reason

    @property
    def logprobs(self) -> tuple[TokenLogprob, ...] | None:
        return self.outputs[0].logprobs


@dataclass(frozen=True)
class Delta:
    """A streamed piece: ``text`` new for sample ``index`` of prompt ``prompt``; the last piece
    of a sample carries its ``finish_reason``."""

    prompt: int
    index: int
    text: str
    token_id: int | None
    finish_reason: str | None = None


def generation_eos_ids(model_dir: str | Path) -> tuple[int, ...]:
    """The end-of-text ids a checkpoint's ``generation_config.json`` names (``eos_token_id``: one
    id or a list; none if the file or the key is missing)."""
    path = Path(model_dir) / "generation_config.json"
    try:
        value = json.loads(path.read_text()).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        return ()
    ids = value if isinstance(value, list) else [value]
    return tuple(i for i in ids if is_int(i) and i >= 0)


class LLM:
    """A model and an engine, ready to generate. ``model``: a checkpoint directory (None: the
    bundled model), or a loaded Transformer with its ``tokenizer``. ``config`` and keyword
    settings: the engine's (EngineConfig; default ``EngineConfig.best()``: paged KV, the token
    budget with chunked prefill, prefix caching). Not thread-safe, as the engine."""

    def __init__(
        self,
        model: Any = None,
        *,
        tokenizer: Any = None,
        device: str | None = None,
        config: EngineConfig | None = None,
        **settings: Any,
    ):
        from tinyllm.engine import ContinuousEngine
        from tinyllm.model.checkpoint import BUNDLED_MODEL, load_checkpoint
        from tinyllm.model.device import resolve_device

        config = (config or EngineConfig.best()).replace(**settings) if settings else (config or EngineConfig.best())
        if model is None or isinstance(model, (str, Path)):
            model_dir = Path(model) if model is not None else BUNDLED_MODEL
            model, loaded = load_checkpoint(model_dir, device=resolve_device(device or config.device))
            tokenizer = tokenizer or loaded
            self.eos_ids = generation_eos_ids(model_dir)
        else:
            self.eos_ids = ()
        self.model, self.tokenizer = model, tokenizer
        eos = getattr(tokenizer, "eos_id", None)
        if eos is not None and eos not in self.eos_ids:
            self.eos_ids = (eos, *self.eos_ids)
        self.engine = ContinuousEngine(model, config=config)

    def generate(
        self, prompts: Any, sampling: RequestSettings | Sequence[RequestSettings] | None = None, *, stream: bool = False
    ) -> list[Generation] | Iterator[Delta]:
        """Generate for ``prompts``: a string, a list of strings, a list of token ids (one
        prompt), a list of such lists, or a NumPy / torch integer array (1-D: one prompt, 2-D:
        one per row). ``sampling``: one SamplingParams for all, or one per prompt (default
        ``SamplingParams()``). Returns a Generation per prompt, in order; ``stream=True``
        returns an iterator of Deltas as tokens are generated instead."""
        items = self._prompts(prompts)
        settings = self._settings(sampling, len(items))
        run = self._run(items, settings)
        if stream:
            return (delta for delta in run if isinstance(delta, Delta))
        return next(out for out in run if isinstance(out, list))

    # -- internals -------------------------------------------------------------------------
    def _prompts(self, prompts: Any) -> list[tuple[str | None, list[int]]]:
        if hasattr(prompts, "tolist") and not isinstance(prompts, (str, list, tuple)):  # NumPy, torch
            prompts = prompts.tolist()
        if isinstance(prompts, str) or (
            isinstance(prompts, (list, tuple)) and prompts and all(is_int(t) for t in prompts)
        ):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ValueError(f"prompts must be a string, token ids, or a non-empty list of them, got {prompts!r:.60}")
        out = []
        for i, p in enumerate(prompts):
            if hasattr(p, "tolist") and not isinstance(p, (str, list, tuple)):
                p = p.tolist()
            if isinstance(p, str):
                if self.tokenizer is None:
                    raise ValueError("a text prompt needs a tokenizer: LLM(model, tokenizer=...)")
                ids = self.tokenizer.encode(p)
                if not ids:
                    raise ValueError(f"prompt {i} is empty: there is nothing to continue")
                out.append((p, ids))
            elif isinstance(p, (list, tuple)) and p and all(is_int(t) and t >= 0 for t in p):
                out.append((None, list(p)))
            else:
                raise ValueError(
                    f"prompt {i} must be a string or a non-empty list of token ids (integers >= 0), got {p!r:.60}"
                )
        return out

    @staticmethod
    def _settings(sampling: Any, n: int) -> list[RequestSettings]:
        if sampling is None:
            return [SamplingParams()] * n
        if isinstance(sampling, RequestSettings):
            return [sampling] * n
        if (
            isinstance(sampling, (list, tuple))
            and len(sampling) == n
            and all(isinstance(s, RequestSettings) for s in sampling)
        ):
            return list(sampling)
        raise ValueError(f"sampling must be one SamplingParams or one per prompt ({n}), got {sampling!r:.80}")

    def _run(self, items: list[tuple[str | None, list[int]]], settings: list[RequestSettings]) -> Iterator:
        """Add every request, step the engine until they have all ended, yielding Deltas as they
        come and, last, the list of Generations."""
        eng = self.engine
        eos = self.eos_ids[0] if self.eos_ids else None
        rids: list[list[int]] = []
        texts: dict[int, StopText] = {}
        where: dict[int, tuple[int, int]] = {}
        pieces: dict[int, list[str]] = {}
        open_: set[int] = set()
        try:
            for i, ((_, ids), s) in enumerate(zip(items, settings)):
                extra = tuple(t for t in self.eos_ids[1:] if t not in s.stop_token_ids) if s.stop_at_eos else ()
                req = s.request(ids, eos)
                if extra:  # the checkpoint's other end-of-text ids end it too
                    req = replace(req, stop_token_ids=(*req.stop_token_ids, *extra))
                try:
                    added = eng.add_forks(req, s.n) if s.n > 1 else [eng.add_request(req)]
                except ValueError as e:
                    raise type(e)(f"prompt {i}: {e}") from None
                rids.append(added)
                open_.update(added)
                for j, rid in enumerate(added):
                    where[rid] = i, j
                    pieces[rid] = []
                    if self.tokenizer is not None:
                        texts[rid] = StopText(self.tokenizer.stream(skip_special_tokens=True), s.stop, s.min_tokens)
            yield from self._step_until_ended(open_, texts, pieces, where)
        finally:  # a bad prompt or a stream closed early: what was added ends, nothing left behind
            if open_:
                for rid in open_:
                    eng.abort(rid)
                for rid in where:
                    eng.results.pop(rid, None)
        out = []
        for (prompt, ids), added in zip(items, rids):
            samples = []
            for j, rid in enumerate(added):
                r = eng.results.pop(rid)
                text = texts.get(rid)
                stop_reason: str | int | None = None
                if text is not None and text.stopped:
                    stop_reason = text.matcher.matched
                elif r.finish_reason in ("eos", "stop") and r.tokens:
                    stop_reason = r.tokens[-1]
                reason = {"eos": "stop"}.get(r.finish_reason, r.finish_reason)
                logprobs = r.logprobs if settings[len(out)].logprobs is not None else None
                samples.append(
                    Completion(
                        j, "".join(pieces[rid]), tuple(r.tokens), reason, stop_reason, logprobs, r.ttft_s, r.latency_s
                    )
                )
            out.append(Generation(prompt, tuple(ids), tuple(samples)))
        yield out

    def _step_until_ended(
        self,
        open_: set[int],
        texts: dict[int, StopText],
        pieces: dict[int, list[str]],
        where: dict[int, tuple[int, int]],
    ) -> Iterator[Delta]:
        """Step the engine until every request in ``open_`` has ended, yielding each new piece of
        text; a stop string found in a request's text ends it in the engine at once."""
        eng = self.engine
        while open_:
            events = eng.step()
            for ev in events:
                if ev.rid not in open_:
                    continue
                text = texts.get(ev.rid)
                piece = text.step(ev.token) if text is not None else ""
                stopped = text is not None and text.stopped
                if stopped:
                    eng.finish(ev.rid, text.tokens)
                done = ev.done or stopped
                if done and text is not None and not stopped:
                    piece += text.flush()
                pieces[ev.rid].append(piece)
                i, j = where[ev.rid]
                reason = None
                if done:
                    open_.discard(ev.rid)
                    reason = "length" if ev.reason == "length" and not stopped else "stop"
                if piece or done:
                    yield Delta(i, j, piece, ev.token, reason)
            for rid in [r for r in open_ if r in eng.results]:  # aborted or failed elsewhere
                open_.discard(rid)
                i, j = where[rid]
                yield Delta(i, j, "", None, eng.results[rid].finish_reason)


__all__ = ["LLM", "MAX_N", "Completion", "Delta", "Generation", "SamplingParams", "generation_eos_ids"]
