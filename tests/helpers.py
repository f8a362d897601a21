"""Shared test helpers: a seeded random model, mixed workloads, the cache invariants, a paused
runner stepped to its end, a CLI refusal, a server in a background thread, and its engine held
while requests gather."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
import threading
import time

import torch

from tinyllm.engine import ContinuousEngine, Request
from tinyllm.engine.solo import generate
from tinyllm.model.config import ModelConfig
from tinyllm.model.transformer import Transformer

SERVED_MODEL = "tinyllm-shakespeare"  # the model name the test servers serve under


def random_model(
    seed: int = 0,
    vocab: int = 256,
    d_model: int = 64,
    n_layers: int = 2,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    max_seq_len: int = 128,
    tie: bool = True,
) -> Transformer:
    """A random model with spread-out logits (std 0.3 weights), so greedy ties are vanishingly rare
    and 'batched == solo' compares real choices, not float noise between near-equal logits."""
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=vocab,
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        d_ff=2 * d_model,
        max_seq_len=max_seq_len,
        tie_embeddings=tie,
    )
    m = Transformer(cfg)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    return m.eval()


def mixed_workload(
    n: int = 24, seed: int = 0, vocab: int = 256, max_prompt: int = 60, max_new: int = 40, eos_ids=(None, None, 5, 17)
) -> list[Request]:
    """Prompt lengths 1..max_prompt, max_new_tokens 1..max_new, some with an EOS that may fire early."""
    rng = random.Random(seed)
    return [
        Request(
            [rng.randrange(vocab) for _ in range(rng.randint(1, max_prompt))],
            rng.randint(1, max_new),
            eos_id=rng.choice(eos_ids),
        )
        for _ in range(n)
    ]


def solo_outputs(model: Transformer, reqs: list[Request]) -> list[list[int]]:
    return [generate(model, r.prompt, r.max_new_tokens, eos_id=r.eos_id) for r in reqs]


def engine_workload(n: int, seed: int = 0) -> tuple[list[Request], list[list[int]]]:
    """``mixed_workload(n, seed)`` with early EOS (``with_early_eos``) and its solo outputs, on
    ``random_model()``: copies (prompts too) of what is computed once per test process (the
    engine-core modules share it; solo generation of 28 requests takes seconds)."""
    reqs, solo = _engine_workload(n, seed)
    return [dataclasses.replace(r, prompt=list(r.prompt)) for r in reqs], [list(t) for t in solo]


@functools.cache
def _engine_workload(n: int, seed: int) -> tuple[list[Request], list[list[int]]]:
    model = random_model()
    reqs = with_early_eos(model, mixed_workload(n, seed=seed))
    return reqs, solo_outputs(model, reqs)


def chunked_engine(
    model: Transformer,
    slots: int | None,
    max_len: int | None = None,
    *,
    block_size: int,
    budget: int,
    seeded: bool = False,
    **settings,
) -> ContinuousEngine:
    """The token-budget scheduler on a paged cache, the tests' usual engine: ``budget`` tokens a
    step over blocks of ``block_size``; ``seeded``: sampling from a generator seeded 0; the other
    settings (kv_blocks, prefix_cache, scheduling_policy, ...) as given."""
    if seeded:
        settings["generator"] = torch.Generator().manual_seed(0)
    return ContinuousEngine(
        model,
        slots,
        max_len,
        kv="paged",
        block_size=block_size,
        chunked_prefill=True,
        max_batched_tokens=budget,
        **settings,
    )


def check_ragged_columns(out, q, pool, items, reference) -> None:
    """Each query column of a ragged attention's output (``items``: (slot, start, n) per sequence,
    their n query tokens in order) equals ``reference`` computed for that row alone."""
    col = 0
    for slot, start, n in items:
        for j in range(n):
            torch.testing.assert_close(
                out[0, :, col], reference(pool, slot, q[0, :, col], start + j), rtol=1e-5, atol=1e-5
            )
            col += 1


def check_invariants(eng: ContinuousEngine) -> None:
    """What must hold after every step, for either cache."""
    slots = eng.slots
    for s in range(eng.n_slots):
        holder = eng._slot_seq[s]
        assert slots.active[s] == (holder is not None), f"slot {s}: active={slots.active[s]} holder={holder}"
        if holder is not None:
            assert holder.slot == s and holder.state == "running"
    assert slots.allocated_tokens() >= slots.used_tokens()
    if eng.kv_kind == "paged":  # each block held by r tables counted once
        once = sum(n for n, a in zip(slots.lens, slots.active) if a)
        assert slots.used_tokens() == once - sum(r - 1 for r in slots.ref if r > 1) * slots.block_size
    assert slots.used_tokens() <= slots.reserved_tokens()
    if eng.kv_kind == "paged":
        held: dict[int, int] = {}  # block → tables holding it
        for s, table in enumerate(slots.tables):
            assert len(set(table)) == len(table), f"slot {s} holds a block twice: {table}"
            for b in table:
                held[b] = held.get(b, 0) + 1
        for s, table in enumerate(slots.tables):  # only full blocks are ever shared: nobody writes them
            for i, b in enumerate(table):
                if held[b] > 1:
                    assert slots.lens[s] >= (i + 1) * slots.block_size, f"shared block {b} not full in slot {s}"
            if slots.active[s]:
                assert len(table) * slots.block_size >= slots.lens[s]
            else:
                assert not table, f"idle slot {s} holds blocks {table}"
        for b in range(slots.n_blocks):
            assert slots.ref[b] == held.get(b, 0), f"block {b}: ref {slots.ref[b]} but held by {held.get(b, 0)}"
        w = slots.table_width  # the flat copy the C kernels read: the same tables
        for s, table in enumerate(slots.tables):
            row = slots.table_rows[s].tolist()
            assert row == table + [slots.n_blocks] * (w - len(table)), f"slot {s}: table_rows {row} != {table}"
        free, lru = set(slots._free), set(slots._lru)
        assert free.isdisjoint(held) and lru.isdisjoint(held) and free.isdisjoint(lru)
        assert len(held) + len(free) + len(lru) == slots.n_blocks == len(held) + slots.num_free_blocks()
        for key, b in slots.cached.items():
            assert slots.block_key[b] == key
        assert all(slots.block_key[b] is not None for b in lru)
        assert sum(k is not None for k in slots.block_key) == len(slots.cached)
        if not slots.prefix_cache:  # then only the samples of one prompt (n > 1) share
            assert not slots.cached and not lru
            assert max(slots.ref, default=0) <= 1 or any(q.fork_of is not None for q in eng._seqs.values())


def run_checked(eng: ContinuousEngine, reqs: list[Request]) -> list[list[int]]:
    """Run requests to completion, checking invariants after every step."""
    rids = [eng.add_request(r) for r in reqs]
    while eng.has_work():
        eng.step()
        check_invariants(eng)
    assert eng.slots.allocated_tokens() == 0
    return [eng.results.pop(r).tokens for r in rids]


def with_early_eos(model: Transformer, reqs: list[Request], every: int = 3, seed: int = 0) -> list[Request]:
    """Give every ``every``-th request an EOS id that its greedy output really produces part-way,
    so early stopping is exercised (a random EOS id would almost never fire)."""
    rng = random.Random(seed)
    out = []
    for i, r in enumerate(reqs):
        if i % every == 0 and r.max_new_tokens > 2:
            toks = generate(model, r.prompt, r.max_new_tokens)
            r = Request(r.prompt, r.max_new_tokens, eos_id=toks[rng.randrange(1, len(toks) - 1)])
        out.append(r)
    return out


def run_random_ops(eng: ContinuousEngine, ops, max_len: int, checked_step) -> tuple[dict[int, Request], set[int]]:
    """Apply hypothesis ops (("add", prompt, new, eos[, params]) / ("abort", rid) / ("finish", rid,
    keep) / ("step", n)), then run to completion; ``checked_step(eng)`` makes one step and checks
    what must hold after it. ``params`` (issue 24's fields: a Sampling with penalties, min_p or a
    seed, stop_token_ids, min_tokens, logprobs) make a request whose tokens are checked against
    the stop rule here. Returns the plain greedy requests that ran to their own end (by id: their
    tokens must equal solo) and the ids actually aborted."""
    added: dict[int, Request] = {}
    aborted: set[int] = set()
    special: dict[int, Request] = {}
    for o in ops:
        if o[0] == "add":
            prompt, new, eos = o[1:4]
            new = min(new, max_len - len(prompt))
            p = o[4] if len(o) > 4 else None
            if p is None:
                req = Request(prompt, new, eos_id=eos)
                added[eng.add_request(req)] = req
            else:
                req = Request(
                    prompt,
                    new,
                    eos_id=eos,
                    sampling=p["sampling"],
                    stop_token_ids=p["stop_token_ids"],
                    min_tokens=min(p["min_tokens"], new),
                    logprobs=p["logprobs"],
                )
                special[eng.add_request(req)] = req
        elif o[0] == "abort":
            if eng.abort(o[1]):
                aborted.add(o[1])
        elif o[0] == "finish":
            if eng.finish(o[1], o[2]):
                added.pop(o[1], None)
                special.pop(o[1], None)
        else:
            for _ in range(o[1]):
                checked_step(eng)
    while eng.has_work():
        checked_step(eng)
    assert set(added) - aborted <= set(eng.results)
    for rid, req in special.items():
        if rid in aborted:
            continue
        toks = eng.results[rid].tokens
        stops = req.stop_ids()
        assert 1 <= len(toks) <= req.max_new_tokens
        assert not any(t in stops for t in toks[: req.min_tokens]), f"request {rid}: a stop id before min_tokens"
        assert not any(t in stops for t in toks[:-1]), f"request {rid}: went on after a stop id"
        assert len(toks) == req.max_new_tokens or toks[-1] in stops, f"request {rid} ended early"
        if req.logprobs is not None:
            lps = eng._seqs[rid].logprobs
            assert [lp.token for lp in lps] == toks and all(len(lp.top) == req.logprobs for lp in lps)
    return added, aborted


def run_to_the_end(runner, aborts: dict[int, int] | None = None):
    """Step a paused ``EngineRunner`` until its engine has no work, publishing after each step
    (as the app does when stepped by hand); ``aborts``: {step: rid}, abort request rid right after
    that step. Then stop the runner, which closes its recorder's file. Returns its last frame."""
    from tui.runners.interface import Abort, StepOnce

    eng, aborts = runner.engine, aborts or {}
    while eng.has_work():
        runner._apply(StepOnce())
        runner._publish()
        if eng.steps in aborts:
            runner._apply(Abort(aborts[eng.steps]))
            runner._publish()
    frame = runner.frame
    runner.stop()
    runner.run()  # returns at once (stopped), closes the file
    return frame


def cli_refusal(argv: list[str], capsys) -> str:
    """Run ``tinyllm ARGV`` in this process; it must refuse: exit status 2, nothing on stdout, one
    line on stderr and no traceback. Returns that line."""
    from tinyllm.cli import main

    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    assert err.count("\n") == 1 and err.endswith("\n") and "Traceback" not in err, err
    return err


def serve_in_thread(model: Transformer, tokenizer, slots: int, port: int = 0, **engine):
    """A started ``tinyllm serve`` in this process (``build_engine(model, slots=, **engine)``), on
    ``port`` (0: any free one), serving as ``SERVED_MODEL``: a ``ServerThread``; the caller stops it."""
    from tinyllm.serve import EngineLoop, ServerThread, build_engine, create_app  # (FastAPI: only where served)

    return ServerThread(
        create_app(EngineLoop(build_engine(model, slots=slots, **engine)), tokenizer, SERVED_MODEL), port=port
    ).start()


@contextlib.contextmanager
def engine_held(loop, waiting: int):
    """Hold an ``EngineLoop``'s engine thread between two steps (a call into it that waits) while
    the block submits requests, until ``waiting`` of them wait; then let it go. They start
    together, however fast the machine: a test that needs requests to overlap gets them."""
    release, holding = threading.Event(), threading.Event()

    def hold(engine) -> None:
        holding.set()
        release.wait(60)

    loop.call_future(hold)
    assert holding.wait(30), "the engine thread never took the hold"
    try:
        yield
        deadline = time.monotonic() + 30
        while loop.waiting() < waiting:
            assert time.monotonic() < deadline, f"{loop.waiting()} requests waiting, not {waiting}"
            time.sleep(0.01)
    finally:
        release.set()


def race_run(slots: int, max_len: int, *sizes: int | None, **settings):
    """build_race's run, in the race's option names: ``slots`` every lane's sequences without a
    KV budget (with ``kv_memory_mib``, ``max_num_seqs`` caps them); ``sizes``: block_size,
    kv_blocks and max_batched_tokens, by position; the rest EngineConfig's."""
    from tinyllm.config import EngineConfig

    settings.update(zip(("block_size", "kv_blocks", "max_batched_tokens"), sizes))
    if settings.get("kv_memory_mib") is None:
        settings["max_num_seqs"] = slots
    return EngineConfig.best(max_len=max_len, **settings)
