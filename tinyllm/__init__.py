"""tinyllm: a small, readable LLM inference engine, and the tools that watch its scheduler.

The names below are loaded on first use, so ``import tinyllm`` stays light (the terminal app
imports parts of this package and must not load torch)::

    from tinyllm import LLM, SamplingParams
    print(LLM().generate("ROMEO:\\n", SamplingParams(max_tokens=40))[0].text)

and the step API: ``ContinuousEngine``, ``EngineConfig``, ``Request``, ``generate``, ``load_checkpoint``.
"""

from tinyllm.lazy import lazy_getattr

_EXPORTS = {
    "LLM": "tinyllm.llm",
    "SamplingParams": "tinyllm.llm",
    "EngineConfig": "tinyllm.config",
    "ContinuousEngine": "tinyllm.engine.continuous",
    "run_continuous": "tinyllm.engine.continuous",
    "run_static": "tinyllm.engine.static",
    "Request": "tinyllm.request",
    "Result": "tinyllm.request",
    "Sampling": "tinyllm.request",
    "generate": "tinyllm.engine.solo",
    "load_checkpoint": "tinyllm.model.checkpoint",
    "Transformer": "tinyllm.model.transformer",
    "Tokenizer": "tinyllm.model.tokenizer",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_getattr(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
