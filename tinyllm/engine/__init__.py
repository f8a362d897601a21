"""The serving core. ``from tinyllm.engine import ...`` keeps the seed's names.

    request.py (top level, no torch)  Sampling, Request, Result, the fit rule
    sequence.py    the engine's record of a request; token Events
    static.py      run_static (the baseline), prefill_padded
    static_lane.py StaticBatcher: static batching one step at a time (run_static runs it; the race steps it)
    continuous.py  ContinuousEngine, run_continuous
    scheduler.py   the token-budget scheduler (chunked prefill)
    ragged.py      one forward over a mixed batch of decodes and prefill chunks
    sampler.py     per-row sampling with per-row failure
"""

from tinyllm.engine.continuous import DEFAULT_MAX_BATCHED_TOKENS, ContinuousEngine, run_continuous
from tinyllm.engine.sequence import Event, Sequence
from tinyllm.engine.static import kv_bytes_per_token, prefill_padded, run_static
from tinyllm.engine.static_lane import StaticBatcher
from tinyllm.request import ContextTooLong, Request, Result, Sampling, check_fits
from tinyllm.stats import Stats, percentile

__all__ = ["DEFAULT_MAX_BATCHED_TOKENS", "ContextTooLong", "ContinuousEngine", "Event", "Request", "Result",
           "Sampling", "Sequence", "StaticBatcher", "Stats", "check_fits", "kv_bytes_per_token", "percentile", "prefill_padded",
           "run_continuous", "run_static"]
