"""The serving core. ``from tinyllm.engine import ...`` keeps the seed's names.

request.py (top level, no torch)  Sampling, Request, Result, the fit rule
sequence.py    the engine's record of a request; token Events
continuous.py  ContinuousEngine (one step = plan -> forward -> commit), run_continuous; its parts:
               commit.py (a forward's outcome committed), lifecycle.py (seated, preempted, ended),
               forks.py (n samples), views.py (snapshot)
scheduler.py   the scheduler interface (plan, StepPlan) and the token-budget scheduler (chunked prefill)
admission.py   prefill then decode: admit into free slots with one prefill, then decode every running slot
policy.py      the scheduling policy: the waiting queue's order and whom to preempt (both schedulers)
forward.py     running a plan on the model: one ragged forward for every scheduler
build.py       from an EngineConfig (tinyllm/config.py) to the engine's parts (sizes, cache, scheduler)
static.py      static batching: StaticBatcher (one step at a time; the race steps it), run_static
               (the baseline, runs it to the end)
sampler.py     the one sampler: every row of a batch in one vectorised pass (penalties, min_p,
               seeds, bans before min_tokens, logprobs), per-row failure
solo.py        generate(): one request alone, the reference every batched path must equal
"""

from tinyllm.engine.continuous import DEFAULT_MAX_BATCHED_TOKENS, ContinuousEngine, run_continuous
from tinyllm.engine.forward import kv_bytes_per_token, prefill_padded
from tinyllm.engine.sequence import Event, Sequence
from tinyllm.engine.solo import generate, generate_stream
from tinyllm.engine.static import StaticBatcher, run_static
from tinyllm.observe.stats import Stats, percentile
from tinyllm.request import ContextTooLong, Request, Result, Sampling, check_fits

__all__ = [
    "DEFAULT_MAX_BATCHED_TOKENS",
    "ContextTooLong",
    "ContinuousEngine",
    "Event",
    "Request",
    "Result",
    "Sampling",
    "Sequence",
    "generate",
    "generate_stream",
    "StaticBatcher",
    "Stats",
    "check_fits",
    "kv_bytes_per_token",
    "percentile",
    "prefill_padded",
    "run_continuous",
    "run_static",
]
