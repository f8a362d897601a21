"""The race: several lanes on the same requests and the same model, one process, taking turns.

Who steps next: the lane that is furthest behind on its own clock (ties: the order shown). Each
clock counts only that lane's compute, so at any moment the screen shows every lane at about the
same point of its own time: the lane ahead on screen is the one ahead in time, whichever got the
CPU. (Plain round robin would give every lane the same number of steps instead, and a scheduler
whose steps cost more would look as fast as one whose steps cost less.)

Every lane decodes greedily and ignores end-of-text, as ``tinyllm bench`` does: each makes exactly
the same tokens, so their step counts, row use and times compare like for like.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tinyllm.args import option_names
from tinyllm.config import DEFAULT_BLOCK_SIZE, EngineConfig
from tinyllm.engine import Request, kv_bytes_per_token
from tinyllm.engine.build import MIB, resolve_concurrency
from tinyllm.engine.forward import kv_cache_dtype_name
from tinyllm.engine.static import StaticBatcher
from tinyllm.race.clock import LaneClock
from tinyllm.race.cost import CostModel
from tinyllm.race.lanes import ContinuousLane, Lane, StaticLane, Workload
from tinyllm.race.rules import DEFAULT_BATCH_TIMEOUT_S, check_static_batches
from tinyllm.race.spec import LaneSpec
from tinyllm.race.views import LANES, LaneView, lane_detail, lane_title
from tinyllm.request import ContextTooLong, check_fits


class Race:
    def __init__(self, lanes: list[Lane]):
        self.lanes = lanes
        self.turns = 0  # steps made, all lanes together
        self.last: str | None = None  # the lane that made the latest step

    def done(self) -> bool:
        return not any(lane.has_work() for lane in self.lanes)

    def step(self) -> Lane | None:
        """One forward pass of the lane furthest behind on its own clock; None when all are done."""
        while True:
            live = [lane for lane in self.lanes if lane.has_work()]
            if not live:
                return None
            lane = min(live, key=Lane.ready_at)  # min() keeps the first of equals: the order shown
            if lane.step():
                self.turns += 1
                self.last = lane.key
                return lane

    def views(self) -> tuple[LaneView, ...]:
        return tuple(lane.view() for lane in self.lanes)


def build_race(
    model,
    workload: Workload,
    run: EngineConfig,
    lanes: tuple[str | LaneSpec, ...] = LANES,
    batch_timeout_s: float = DEFAULT_BATCH_TIMEOUT_S,
    step_cost_s: float | CostModel | None = None,
    lane_cap: int | None = None,
    bytes_per_token: Callable[[str], int] | None = None,
) -> Race:
    """The lanes on ``workload`` (sorted by arrival here; request ids follow that order in every
    lane). ``run``: the run's engine settings, with ``max_len`` (every lane's context): every lane
    starts from them, and its kind and its own settings (``LaneSpec``: the what-if,
    ``race/spec.py``) change them. ``step_cost_s``: a fixed cost per step (deterministic tests),
    or a CostModel (the cost clock: each step costs its work), instead of measured time.
    ValueError / ContextTooLong, before anything runs, for a request or a setting some lane
    could not take.

    Without a KV budget, ``run.max_num_seqs`` is every lane's sequences (static batching's batch).
    With ``run.kv_memory_mib`` (--kv-memory; a lane's ``kv_mib=`` overrides it) every lane has
    the same KV memory, as ``tinyllm bench``'s headline table: static batching and the slot cache
    get the rows of ``max_len`` the budget buys, the paged lanes the blocks it buys, run by up to
    ``run.max_num_seqs`` sequences (default 64; a lane's ``slots=`` caps its own). A run without a
    budget whose lanes have their own (``kv_mib=``) caps their sequences with ``lane_cap``
    (--max-num-seqs there: ``run.max_num_seqs`` is then the other lanes' sequences). The arithmetic
    and its refusals are the engine's (engine/build.py). ``run.kv_cache_dtype`` (a lane's
    ``kv_dtype=`` overrides it): every lane's KV element type; at bfloat16 a budget buys twice
    the tokens. ``bytes_per_token(kv_dtype)``: the KV bytes a token holds, where ``model`` is a
    stand-in for the real one (whatif and tune on the cost clock): budgets are turned into rows and
    blocks at the real model's size, so the schedule is the real model's."""
    if run.max_len is None:
        raise ValueError("the race needs the run's max_len: every lane's context")
    max_len, kv_memory_mib = run.max_len, run.kv_memory_mib
    slots = run.seqs_cap  # without a budget: every lane's sequences
    max_num_seqs = run.max_num_seqs if kv_memory_mib is not None else lane_cap  # with one: the cap (None: default)
    # Where every lane starts: the run's chunked lane without its budget and cap (a lane's own).
    start = run.replace(kv="paged", chunked_prefill=True, kv_memory_mib=None, max_num_seqs=None, seed=run.seed or 0)
    specs = [lane if isinstance(lane, LaneSpec) else LaneSpec(lane, lane) for lane in lanes]
    unknown = [s.label for s in specs if s.kind not in LANES]
    if unknown or not specs:
        raise ValueError(f"unknown lane(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(LANES)}")
    workload = sorted(workload, key=lambda item: item[0])
    for t, r in workload:
        if not isinstance(r, Request) or r.sampling is not None or r.eos_id is not None:
            raise ValueError("race requests are greedy and ignore end-of-text: Request(prompt, max_new_tokens)")
        check_fits(len(r.prompt), r.max_new_tokens, max_len, "--max-len")
        bad = next((t for t in r.prompt if t >= model.cfg.vocab_size), None)
        if bad is not None:
            raise ValueError(
                f"a request's prompt has token id {bad}, outside the model's vocabulary "
                f"[0, {model.cfg.vocab_size}): recorded with another model?"
            )
    kv_cache_dtype_name(next(model.parameters()).device, run.kv_cache_dtype)  # a ValueError names the choices
    plain = all(s.label == s.kind for s in specs) and len({s.kind for s in specs}) == len(specs)
    built: list[Lane] = []
    for i, spec in enumerate(specs):
        mib = spec.kv_mib if spec.kv_mib is not None else kv_memory_mib
        where = "kv_mib" if spec.kv_mib is not None else "--kv-memory"
        key = f"lane{i}" if not plain else spec.kind
        try:
            lane_run = start.replace(kv_cache_dtype=spec.kv_dtype or run.kv_cache_dtype)
            built.append(
                _build_lane(
                    model,
                    workload,
                    spec,
                    key,
                    lane_run,
                    slots,
                    mib,
                    max_num_seqs,
                    batch_timeout_s,
                    step_cost_s,
                    bytes_per_token,
                )
            )
            built[-1].kv_dtype = kv_cache_dtype_name(next(model.parameters()).device, lane_run.kv_cache_dtype)
        except ValueError as e:
            raise (ContextTooLong if isinstance(e, ContextTooLong) else ValueError)(
                f"lane {spec.label!r}: {option_names(str(e), ('kv_memory_mib', where))}"
            ) from None
    return Race(built)


def _build_lane(
    model,
    workload: Workload,
    spec: LaneSpec,
    key: str,
    run: EngineConfig,
    slots: int,
    mib: float | None,
    max_num_seqs: int | None,
    batch_timeout_s: float,
    step_cost_s: float | CostModel | None,
    bytes_per_token: Callable[[str], int] | None = None,
) -> Lane:
    """One lane of build_race (see it). ``run``: the run's settings with the lane's KV dtype (a
    continuous lane's config is a replace() of it); ``mib``: its KV memory budget, if it has one."""
    max_len, kv_dtype, seed = run.max_len, run.kv_cache_dtype, run.seed
    if bytes_per_token is not None:  # a stand-in model: the real one's size decides the pool
        bpt = bytes_per_token(kv_dtype)
    else:
        bpt = kv_bytes_per_token(model, next(model.parameters()).device, kv_dtype)
    arrivals = any(t > 0 for t, _ in workload)
    title = lane_title(spec.label, spec.kind)
    budget = spec.budget or run.budget
    clock = LaneClock(cost=step_cost_s) if isinstance(step_cost_s, CostModel) else LaneClock(step_cost_s)
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    cap = spec.slots or max_num_seqs  # with a budget: the cap on running sequences
    if mib is not None and not (isinstance(mib, (int, float)) and 0 < mib < float("inf")):
        raise ValueError(f"kv_memory_mib must be a finite number of MiB > 0, got {mib!r}")
    if mib is not None and spec.kv_blocks is not None:
        raise ValueError("blocks= sizes the pool, and so does kv_memory_mib: give one")
    if spec.kind == "static":
        n = spec.slots or slots
        if mib is not None:  # the slot cache's rows: the same arithmetic
            n, _ = resolve_concurrency(EngineConfig(max_num_seqs=cap, kv_memory_mib=mib), max_len, bpt)
        sizes = [(len(r.prompt), r.max_new_tokens) for _, r in workload]
        if mib is None:
            check_static_batches(sizes, n, model.cfg.max_seq_len)
        else:  # its rows hold max_len: a padded row must fit one
            check_static_batches(sizes, n, max_len, "max_len (the row a KV budget reserves)")
        eng = StaticBatcher(
            model,
            n,
            generator=gen,
            clock=clock.now,
            batch_timeout_s=batch_timeout_s,
            kv_cache_dtype=kv_dtype,
            max_len=None if mib is None else max_len,
        )
        lane: Lane = StaticLane(key, title, "", clock, workload, eng)
        lane.seqs, lane.kv_mib = n, n * max_len * bpt / MIB
    else:
        config = lane_config(spec, run, slots, cap, mib)
        if bytes_per_token is not None and config.kv_memory_mib is not None:  # the budget's rows or
            n, blocks = resolve_concurrency(config, max_len, bpt)  # blocks at the real model's size
            config = config.replace(kv_memory_mib=None, max_num_seqs=n, kv_blocks=blocks)
        lane = ContinuousLane(key, title, spec.kind, "", clock, workload, model, None, config=config, generator=gen)
        for _, r in workload:
            lane.engine.slots.check_fits(len(r.prompt) + r.max_new_tokens)  # paged: the whole pool, alone
        cache = lane.engine.slots
        lane.seqs, lane.kv_mib = lane.engine.n_slots, cache.reserved_tokens() * bpt / MIB
        lane.kv_blocks = cache.n_blocks if lane.engine.kv_kind == "paged" else None
        n = lane.seqs
    lane.detail = lane_detail(spec.kind, n, batch_timeout_s, budget, arrivals)
    if (spec.label != spec.kind or spec.recorded) and spec.describe():
        lane.detail = f"{lane.detail}; {spec.describe()}"
    if spec.spec and spec.kind == "chunked":
        lane.detail += f" by the draft model {run.speculative_model}" if run.speculative_model else " by n-gram lookup"
    return lane


def lane_config(spec: LaneSpec, run: EngineConfig, slots: int, cap: int | None, mib: float | None) -> EngineConfig:
    """A continuous lane's engine settings: the run's (``run``), with what the lane's kind and its
    own settings change. ``slots``: the sequences without a KV budget; ``cap``: with ``mib``, a
    budget, the cap on running sequences (None: the engine's default)."""
    changes: dict = dict(scheduling_policy=spec.policy, block_size=spec.block_size or run.block_size)
    if mib is not None:  # the budget sizes the pool: no block count
        changes.update(kv_memory_mib=mib, max_num_seqs=cap, kv_blocks=None)
    else:
        changes.update(max_num_seqs=spec.slots or slots, kv_blocks=spec.kv_blocks or run.kv_blocks)
    if spec.kind == "chunked":
        changes.update(max_batched_tokens=spec.budget or run.max_batched_tokens, prefix_cache=spec.prefix_cache)
        # spec=N: N tokens drafted per step (engine/speculate.py), as the run's speculative config
        # says (whatif --speculative-config: n-gram lookup by default, or a draft model)
        changes.update(num_speculative_tokens=spec.spec or 0)
        if not spec.spec:
            changes.update(speculative_model=None)
    else:  # prefill then decode, on slots (the default) or on the paged pool
        changes.update(chunked_prefill=False, max_batched_tokens=None, prefix_cache=None)
        changes.update(num_speculative_tokens=0, speculative_model=None)
        if spec.kv != "paged":
            changes.update(kv="slots", block_size=DEFAULT_BLOCK_SIZE, kv_blocks=None)
    return run.replace(**changes)
