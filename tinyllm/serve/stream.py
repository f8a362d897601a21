"""PLACE FOR ``GET /v1/tinyllm/stream``: engine snapshots and lifecycle events, streamed.

Not written yet, on purpose: this module is reserved for that endpoint. ``create_app`` calls
``add_stream_route(app, engine_loop)`` once, after the OpenAI routes, so whatever is added here
is served with the rest. What is available to it:

- ``engine_loop.add_step_hook(hook)`` (before the app starts): ``hook(engine, token_events,
  lifecycle_events)`` runs in the engine thread after every step, where ``engine.snapshot()``
  is safe to call; hand what it records to the event loop (e.g. ``loop.call_soon_threadsafe``).
- ``await engine_loop.call_async(fn)``: run ``fn(engine)`` in the engine thread between steps
  and get its result (a snapshot on demand).
- Errors in OpenAI's shape: raise ``tinyllm.serve.protocol.ApiError``.
"""

from __future__ import annotations

from typing import Any

from tinyllm.serve.engine_loop import EngineLoop


def add_stream_route(app: Any, engine_loop: EngineLoop) -> None:
    """Register ``GET /v1/tinyllm/stream`` on ``app`` (a FastAPI app). Currently a no-op."""
    # >>> GET /v1/tinyllm/stream goes here <<<
