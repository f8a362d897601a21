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

In-process: ``app = create_app(EngineLoop(engine), tokenizer, "name")`` then
``with ServerThread(app) as s: ...`` (``s.url``, ``s.engine_loop``).
"""

from tinyllm.serve.app import create_app
from tinyllm.serve.engine_loop import EngineLoop, StepHook
from tinyllm.serve.handle import Output, RequestFailed, RequestHandle, RequestRejected
from tinyllm.serve.metrics import ServeMetrics
from tinyllm.serve.security import Limits
from tinyllm.serve.server import ServerThread, build_engine, model_name_for, run_server

__all__ = [
    "EngineLoop",
    "Limits",
    "Output",
    "RequestFailed",
    "RequestHandle",
    "RequestRejected",
    "ServeMetrics",
    "ServerThread",
    "StepHook",
    "build_engine",
    "create_app",
    "model_name_for",
    "run_server",
]
