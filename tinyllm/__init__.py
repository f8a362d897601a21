"""tinyllm: a small, readable LLM inference engine, and the tools that watch its scheduler.

The names below are loaded on first use, so ``import tinyllm`` stays light (the terminal app
imports parts of this package and must not load torch)::

    from tinyllm import LLM, SamplingParams
    print(LLM().generate("ROMEO:\\n", SamplingParams(max_tokens=40))[0].outputs[0].text)

vLLM's offline names (``LLM``, ``SamplingParams``, ``RequestOutput``, ``CompletionOutput``,
``Logprob``), and the step API: ``ContinuousEngine``, ``EngineConfig``, ``Request``, ``generate``, ``load_checkpoint``.
"""

from tinyllm.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "tinyllm.llm": ("LLM",),
        "tinyllm.sampling_params": ("SamplingParams",),
        "tinyllm.outputs": ("RequestOutput", "CompletionOutput", "Logprob"),
        "tinyllm.config": ("EngineConfig",),
        "tinyllm.engine.continuous": ("ContinuousEngine", "run_continuous"),
        "tinyllm.engine.static": ("run_static",),
        "tinyllm.request": ("Request", "Result", "Sampling"),
        "tinyllm.engine.solo": ("generate",),
        "tinyllm.model": ("load_checkpoint", "Transformer", "Tokenizer"),
    },
)
