"""``tinyllm serve``: an OpenAI-compatible HTTP server over the continuous-batching engine.

    engine_loop.py  EngineLoop: the one thread that steps the engine; per-request asyncio queues
    protocol.py     the OpenAI completions API: request parsing, errors, response and chunk shapes
    app.py          the ASGI app (FastAPI): /v1/completions, /v1/models, /health, /metrics
    metrics.py      Prometheus metrics with vLLM's names (a step hook)
    stream.py       reserved: GET /v1/tinyllm/stream (add_stream_route)
    server.py       the engine the server runs, uvicorn (run_server for the CLI, ServerThread)

In-process: ``app = create_app(EngineLoop(engine), tokenizer, "name")`` then
``with ServerThread(app) as s: ...`` (``s.url``, ``s.engine_loop``).
"""

from tinyllm.serve.app import create_app
from tinyllm.serve.engine_loop import EngineLoop, Output, RequestFailed, RequestHandle, RequestRejected, StepHook
from tinyllm.serve.metrics import ServeMetrics
from tinyllm.serve.server import ServerThread, build_engine, model_name_for, run_server

__all__ = ["EngineLoop", "Output", "RequestFailed", "RequestHandle", "RequestRejected", "ServeMetrics",
           "ServerThread", "StepHook", "build_engine", "create_app", "model_name_for", "run_server"]
