"""``tinyllm.LLM``: vLLM's offline API on tinyllm's engine. A vLLM script runs with its import changed::

    from tinyllm import LLM, SamplingParams
    llm = LLM()                                  # the bundled model, the engine's best path
    for out in llm.generate(["ROMEO:\\n"], SamplingParams(temperature=0.8, max_tokens=60, seed=1)):
        print(out.outputs[0].text)

The names, defaults and types are vLLM 0.32's (``LLM``, ``generate``, ``chat``,
``get_tokenizer``, ``SamplingParams``, ``RequestOutput``, ``CompletionOutput``, ``Logprob``); what
vLLM has and this engine cannot do is refused by name (``REFUSED``).

The engine runs in an ``EngineLoop`` (tinyllm/serve/engine_loop.py, the server's): one thread
owns it and serves every caller, so several threads may call ``generate`` on one LLM at once, and
streams read in any order each get exactly their own text (how a call runs: tinyllm/llm_call.py).
This module turns vLLM's arguments into the engine's settings and each prompt into a checked
engine request.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from tinyllm.config import EngineConfig, speculative_settings
from tinyllm.llm_call import Job, Stream
from tinyllm.outputs import RequestOutput
from tinyllm.request import MAX_LOGPROBS, SamplingError, is_int, token_ids
from tinyllm.sampling_params import SamplingParams, per_prompt
from tinyllm.serve.engine_loop import EngineLoop

DTYPES = {"auto": None, "float32": "float32", "float": "float32", "bfloat16": "bfloat16"}

REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {  # vLLM's LLM argument -> (values taken, why others are not)
    "tensor_parallel_size": ((1,), "tensor parallelism is not supported: tinyllm runs on one device"),
    "pipeline_parallel_size": ((1,), "pipeline parallelism is not supported: tinyllm runs on one device"),
    "data_parallel_size": ((1,), "data parallelism is not supported: run one LLM per device"),
    "quantization": ((None,), "quantized checkpoints are not supported (float32 and bfloat16 weights only)"),
    "enable_lora": ((False, None), "LoRA adapters are not supported"),
    "limit_mm_per_prompt": ((None,), "multimodal inputs are not supported: tinyllm runs text models"),
    "revision": ((None,), "tinyllm loads local checkpoint directories only; nothing is downloaded"),
    "tokenizer_revision": ((None,), "tinyllm loads local checkpoint directories only; nothing is downloaded"),
    "tokenizer_mode": (("auto",), "tinyllm reads the checkpoint's tokenizer.json (mode 'auto') only"),
    "runner": (("auto", "generate"), "tinyllm runs generative models only (no pooling)"),
    "cpu_offload_gb": ((0,), "CPU offload of weights is not supported"),
    "hf_token": ((None,), "tinyllm loads local checkpoint directories only; nothing is downloaded"),
}
NO_EFFECT = {  # vLLM's LLM arguments taken with no effect here, and why
    "trust_remote_code": "tinyllm runs no code from a checkpoint (Llama-family weights only)",
    "disable_log_stats": "tinyllm logs no stats while generating",
    "swap_space": "preempted requests are recomputed, never swapped",
    "disable_custom_all_reduce": "one device: no all-reduce",
    "max_seq_len_to_capture": "CUDA graphs are captured per attention window (cuda_graph)",
    "compilation_config": "tinyllm does not compile the model",
    "load_format": "tinyllm reads safetensors (or a PyTorch state dict) from the directory",
}


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
    """A model and an engine, ready to generate, by vLLM's ``LLM`` arguments (see docs/engine.md,
    "Coming from vLLM"). ``model``: a checkpoint directory (None: the bundled model) or a loaded
    Transformer; ``tokenizer``: a directory holding tokenizer.json, a Tokenizer, or None (the
    model's). The engine's own settings are taken too, as an EngineConfig (``config``) and/or
    keywords (``LLM(kv="slots")``); the default is ``EngineConfig.best()``. Safe to use from
    several threads."""

    def __init__(
        self,
        model: Any = None,
        tokenizer: Any = None,
        *,
        skip_tokenizer_init: bool = False,
        dtype: str = "auto",
        seed: int | None = 0,
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        enable_prefix_caching: bool | None = None,
        enable_chunked_prefill: bool | None = None,
        block_size: int | None = None,
        kv_cache_dtype: str = "auto",
        gpu_memory_utilization: float | None = None,
        kv_cache_memory_bytes: int | None = None,
        enforce_eager: bool = False,
        max_logprobs: int = MAX_LOGPROBS,
        device: str | None = None,
        config: EngineConfig | None = None,
        **kwargs: Any,
    ):
        from tinyllm.engine import ContinuousEngine
        from tinyllm.model.checkpoint import BUNDLED_MODEL, load_checkpoint
        from tinyllm.model.device import resolve_device
        from tinyllm.model.tokenizer import PreTrainedTokenizerView

        engine_settings = speculative_settings(kwargs.pop("speculative_config", None)) | _engine_keywords(kwargs)
        if not isinstance(enforce_eager, bool):
            raise ValueError(f"enforce_eager must be True or False, got {enforce_eager!r}")
        if not is_int(max_logprobs) or not 0 <= max_logprobs <= MAX_LOGPROBS:
            raise ValueError(f"max_logprobs must be an integer from 0 to {MAX_LOGPROBS}, got {max_logprobs!r}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(map(repr, DTYPES))}, got {dtype!r}")
        vllm_names = {
            "max_len": max_model_len,
            "max_num_seqs": max_num_seqs,
            "max_batched_tokens": max_num_batched_tokens,
            "prefix_cache": enable_prefix_caching,
            "chunked_prefill": enable_chunked_prefill,
            "block_size": block_size,
            "kv_cache_dtype": None if kv_cache_dtype == "auto" else kv_cache_dtype,
            "seed": seed,
            "device": device,
            "kv_memory_mib": _kv_mib(kv_cache_memory_bytes),
        }
        changes = {k: v for k, v in vllm_names.items() if v is not None} | engine_settings
        config = (config or EngineConfig.best()).replace(**changes)
        dev = resolve_device(config.device)
        if model is None or isinstance(model, (str, Path)):
            model_dir = Path(model) if model is not None else BUNDLED_MODEL
            weights = None if DTYPES[dtype] is None else _torch_dtype(DTYPES[dtype])
            model, loaded = load_checkpoint(model_dir, device=dev, dtype=weights)
            self.eos_ids = generation_eos_ids(model_dir)
        else:
            loaded, self.eos_ids = None, ()
        base = None if skip_tokenizer_init else _tokenizer(tokenizer, loaded)
        if gpu_memory_utilization is not None:
            config = config.replace(kv_memory_mib=_kv_mib_of_gpu_share(gpu_memory_utilization, dev))
        self.model = model
        self.tokenizer = None if base is None else PreTrainedTokenizerView(base)
        self._tok = base  # the engine's Tokenizer: streaming decode, token texts
        eos = getattr(base, "eos_id", None)
        if eos is not None and eos not in self.eos_ids:
            self.eos_ids = (eos, *self.eos_ids)
        self.max_logprobs = max_logprobs
        self.engine = ContinuousEngine(model, config=config)  # read it only between calls
        self._loop = EngineLoop(self.engine, name="tinyllm-llm-engine")
        self._loop.start()
        weakref.finalize(self, self._loop.stop, 5.0)  # (the thread holds the engine, not this LLM)

    # -- vLLM's surface ----------------------------------------------------------------------
    def get_tokenizer(self) -> Any:
        """The tokenizer, with transformers' everyday surface (encode, decode, apply_chat_template,
        eos_token_id, ...); None with ``skip_tokenizer_init=True``."""
        return self.tokenizer

    def generate(
        self,
        prompts: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        lora_request: Any = None,
        priority: list[int] | None = None,
        stream: bool = False,
    ) -> list[RequestOutput] | Stream:
        """Generate for ``prompts``: a string, a list of strings, token ids (one prompt), a list
        of such lists, vLLM's prompt dicts (``{"prompt": ...}``, ``{"prompt_token_ids": ...}``),
        or a NumPy / torch integer array (1-D: one prompt, 2-D: one per row). ``sampling_params``:
        one for all, or one per prompt (default ``SamplingParams()``); ``priority``: one per
        prompt (the "priority" policy). Returns a RequestOutput per prompt, in order; with
        ``use_tqdm`` a progress bar on a terminal's stderr. ``stream=True`` (tinyllm's) returns a
        Stream of Deltas as tokens are generated instead."""
        if lora_request is not None:
            raise ValueError("lora_request: LoRA adapters are not supported by tinyllm")
        jobs = self._jobs(self._prompts(prompts), sampling_params, priority)
        run = Stream(self, jobs, use_tqdm and not stream)
        return run if stream else run.outputs()

    def chat(
        self,
        messages: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_request: Any = None,
        chat_template: str | None = None,
        chat_template_content_format: str = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Any = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        *,
        stream: bool = False,
    ) -> list[RequestOutput] | Stream:
        """Answer a conversation (a list of ``{"role", "content"}`` messages) or a list of them:
        each rendered with the checkpoint's chat template (or ``chat_template``), as vLLM does,
        then generated as ``generate`` would. Returns a RequestOutput per conversation."""
        from tinyllm.model.tokenizer import template_source
        from tinyllm.serve.body import ApiError
        from tinyllm.serve.chat import parse_messages
        from tinyllm.serve.chat_template import render

        if self._tok is None:
            raise ValueError("chat needs a tokenizer: this LLM was built with skip_tokenizer_init=True")
        for name, value, why in (
            ("tools", tools, "tool calling is not supported by tinyllm"),
            ("continue_final_message", continue_final_message, "continuing the final message is not supported"),
        ):
            if value:
                raise ValueError(f"{name}: {why}")
        if chat_template_content_format not in ("auto", "string", "openai"):
            raise ValueError(
                f"chat_template_content_format must be 'auto', 'string' or 'openai', got {chat_template_content_format!r}"
            )
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a conversation (a list of messages) or a list of conversations")
        conversations = messages if isinstance(messages[0], list) else [messages]
        source = template_source(chat_template) if chat_template is not None else self._tok.chat_template
        prompts = []
        for i, conv in enumerate(conversations):
            try:
                msgs = list(parse_messages(conv))
            except ApiError as e:
                where = f"conversation {i}: " if len(conversations) > 1 else ""
                raise ValueError(f"{where}{e}") from None
            tokens = {**self._tok.special_tokens, **(chat_template_kwargs or {})}
            text = render(source, msgs, add_generation_prompt, tokens)
            prompts.append({"prompt": text, "prompt_token_ids": self._tok.encode(text, add_special_tokens=False)})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, lora_request=lora_request, stream=stream)

    def close(self) -> None:
        """Stop the engine thread (unfinished requests end with an error). Also done when the
        LLM is garbage-collected."""
        self._loop.stop()

    # -- internals -------------------------------------------------------------------------
    def _prompts(self, prompts: Any) -> list[tuple[str | None, list[int]]]:
        """Each prompt as (its text or None, its token ids)."""
        if hasattr(prompts, "tolist") and not isinstance(prompts, (str, list, tuple)):  # NumPy, torch
            prompts = prompts.tolist()
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, (list, tuple)) and prompts and all(_integral(t) for t in prompts)
        ):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ValueError(f"prompts must be a string, token ids, or a non-empty list of them, got {prompts!r:.60}")
        return [self._prompt(p, i) for i, p in enumerate(prompts)]

    def _prompt(self, p: Any, i: int) -> tuple[str | None, list[int]]:
        if isinstance(p, dict):  # vLLM's TextPrompt / TokensPrompt
            unknown = sorted(set(p) - {"prompt", "prompt_token_ids"})
            if unknown:
                raise ValueError(f"prompt {i}: {', '.join(unknown)} not supported (give prompt or prompt_token_ids)")
            if "prompt_token_ids" in p:
                return p.get("prompt"), self._ids(p["prompt_token_ids"], i)
            p = p.get("prompt")
        if isinstance(p, str):
            if self._tok is None:
                raise ValueError("a text prompt needs a tokenizer: this LLM was built with skip_tokenizer_init=True")
            ids = self._tok.encode(p, add_special_tokens=True)  # as vLLM: a Llama's BOS first
            if not ids:
                raise ValueError(f"prompt {i} is empty: there is nothing to continue")
            return p, ids
        return None, self._ids(p, i)

    @staticmethod
    def _ids(p: Any, i: int) -> list[int]:
        ids = token_ids(p)
        if isinstance(ids, (list, tuple)) and ids and all(is_int(t) and t >= 0 for t in ids):
            return list(ids)
        raise ValueError(f"prompt {i} must be a string or a non-empty list of token ids (integers >= 0), got {p!r:.60}")

    def _jobs(self, items: list[tuple[str | None, list[int]]], sampling_params: Any, priority: Any) -> list[Job]:
        """One checked engine request per prompt: every prompt is refused before any runs."""
        params = per_prompt(sampling_params, len(items))
        if priority is not None and (
            not isinstance(priority, (list, tuple)) or len(priority) != len(items) or not all(map(is_int, priority))
        ):
            raise ValueError(f"priority must be a list of one integer per prompt ({len(items)}), got {priority!r:.60}")
        eos = self.eos_ids[0] if self.eos_ids else None
        jobs = []
        for i, ((text, ids), sp) in enumerate(zip(items, params)):
            try:
                if sp.logprobs is not None and sp.logprobs > self.max_logprobs:
                    raise SamplingError(
                        "logprobs", f"logprobs {sp.logprobs} is more than max_logprobs {self.max_logprobs}"
                    )
                settings = sp.settings(room=self.engine.max_len - len(ids))
                req = settings.request(ids, eos)
                extra = (
                    tuple(t for t in self.eos_ids[1:] if t not in req.stop_token_ids) if settings.stop_at_eos else ()
                )
                if extra:  # the checkpoint's other end-of-text ids end it too
                    req = replace(req, stop_token_ids=(*req.stop_token_ids, *extra))
                if priority is not None:
                    req = replace(req, priority=priority[i])
                req = self.engine.check_request(req)
            except ValueError as e:
                raise _for_prompt(e, i, len(items)) from None
            jobs.append(Job(i, text, ids, sp, req, settings.stop))
        return jobs


def _for_prompt(e: ValueError, i: int, n: int) -> ValueError:
    """``e`` of the same type and fields, its message naming the prompt (when there are several)."""
    if n == 1:
        return e
    out = type(e).__new__(type(e))
    out.args = (f"prompt {i}: {e}",)
    out.__dict__.update(e.__dict__)  # SamplingError's field
    return out


def _engine_keywords(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keywords left after LLM's own: vLLM's refused or no-effect arguments (checked and
    dropped), and the engine's settings (returned). Anything else is a TypeError, as vLLM's."""
    settings = {}
    for name, value in kwargs.items():
        if name in REFUSED:
            taken, why = REFUSED[name]
            if value not in taken:
                raise ValueError(f"{name}={value!r}: {why}")
        elif name in NO_EFFECT:
            continue
        elif name in EngineConfig.settings():
            settings[name] = value
        else:
            raise TypeError(
                f"LLM() got an unexpected keyword argument {name!r} (vLLM's arguments tinyllm takes are in "
                f"docs/engine.md, 'Coming from vLLM'; the engine's own: {', '.join(EngineConfig.settings())})"
            )
    return settings


def _kv_mib(nbytes: Any) -> float | None:
    if nbytes is None:
        return None
    if not is_int(nbytes) or nbytes < 1:
        raise ValueError(f"kv_cache_memory_bytes must be an integer number of bytes >= 1, got {nbytes!r}")
    return nbytes / 2**20


def _kv_mib_of_gpu_share(share: Any, device: str) -> float:
    """vLLM's ``gpu_memory_utilization``: the share of the GPU's memory this LLM may use; the KV
    cache gets what the model (and anything else already there) leaves of it. CUDA only."""
    import torch

    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise ValueError(f"gpu_memory_utilization must be a number in (0, 1], got {share!r}")
    if not device.startswith("cuda"):
        raise ValueError(
            f"gpu_memory_utilization sizes the KV cache from a GPU's memory, and this LLM runs on {device}: "
            "give kv_cache_memory_bytes (or leave both out for the engine's default)"
        )
    free, total = torch.cuda.mem_get_info(torch.device(device))
    room = share * total - (total - free)
    if room <= 0:
        raise ValueError(
            f"gpu_memory_utilization {share} leaves no memory for the KV cache: {(total - free) / 2**30:.1f} GiB "
            f"of the GPU's {total / 2**30:.1f} GiB are in use already; raise it"
        )
    return room / 2**20


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def _tokenizer(given: Any, loaded: Any) -> Any:
    """The engine's Tokenizer: a directory's, the one given, or the checkpoint's."""
    from tinyllm.model.tokenizer import PreTrainedTokenizerView, Tokenizer

    if given is None:
        return loaded
    if isinstance(given, (str, Path)):
        return Tokenizer.from_dir(given)
    if isinstance(given, PreTrainedTokenizerView):
        return given.base
    if isinstance(given, Tokenizer):
        return given
    raise TypeError(f"tokenizer must be a directory holding tokenizer.json or a Tokenizer, got {type(given).__name__}")


def _integral(t: Any) -> bool:
    import numbers

    return isinstance(t, numbers.Integral) and not isinstance(t, bool)


__all__ = ["LLM", "NO_EFFECT", "REFUSED", "SamplingParams", "Stream", "generation_eos_ids"]
