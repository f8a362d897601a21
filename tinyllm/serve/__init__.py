"""``tinyllm serve``: an OpenAI-compatible HTTP server over the continuous-batching engine.

    engine_loop.py  EngineLoop: the one thread that steps the engine
    handle.py       RequestHandle: a request as its handler sees it (its asyncio queue, Output)
    protocol.py     the OpenAI completions API's requests: parsing (the sampling fields for both routes)
    body.py         a request body as JSON, errors in OpenAI's shape, the typed field readers
    fit.py          a prompt fits the vocabulary, the context and the KV room (400s before the engine)
    completions.py  the completions API's responses, chunks, usage and logprobs
    chat.py         the chat completions API: messages, chat's response and chunk shapes
    chat_template.py  the checkpoint's chat_template rendered in jinja2's sandbox, as transformers does
    tokenization.py vLLM's /tokenize and /detokenize shapes
    app.py          the ASGI app (FastAPI): /v1/completions, /v1/chat/completions, /tokenize, /detokenize,
                    /v1/models, /health, /metrics
    metrics.py      Prometheus metrics with vLLM's names (a step hook)
    stream.py       GET /v1/tinyllm/stream and POST /v1/tinyllm/abort (add_stream_route)
    server.py       the engine the server runs, uvicorn (run_server for the CLI, ServerThread)
    security.py     --api-key (every route but /health and /metrics), limits on what a client sends
    loadtest.py     python -m tinyllm.serve.loadtest: overload on loopback, measured and checked

The offline ``tinyllm.LLM`` runs its engine in an EngineLoop too (one thread serves every caller).

In-process: ``app = create_app(EngineLoop(engine), tokenizer, "name")`` then
``with ServerThread(app) as s: ...`` (``s.url``, ``s.engine_loop``).
"""

from tinyllm.lazy import lazy_exports

# Loaded on first use: tinyllm.LLM drives the engine through EngineLoop and must not import FastAPI.
__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "tinyllm.serve.app": ("create_app",),
        "tinyllm.serve.engine_loop": ("EngineLoop", "StepHook"),
        "tinyllm.serve.handle": ("Output", "RequestFailed", "RequestHandle", "RequestRejected"),
        "tinyllm.serve.metrics": ("ServeMetrics",),
        "tinyllm.serve.security": ("Limits",),
        "tinyllm.serve.server": ("ServerThread", "build_engine", "model_name_for", "run_server"),
    },
)
