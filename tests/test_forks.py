"""n > 1 (issue 24 item 5): n samples of one prompt as forks that share its blocks.

The engine (token-budget scheduler) prefills the prompt once; at the parent's first token each
sample takes a slot, shares the prompt's full blocks (refcount + 1) and gets a copy of the partial
last block, then samples its own first token from the parent's logits row. Checked here: one
prompt's worth of prefill, shared blocks right after the fork, everything free at the end (the
invariants after every step), each seeded sample equal to its seeded solo run, greedy samples
equal to greedy solo, fallbacks when slots or blocks run out, aborts before the fork, random
schedules with forks mixed in (hypothesis), and ``n`` through the server with the openai client.
"""

from __future__ import annotations

import functools
import json

import httpx
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.helpers import SERVED_MODEL, check_invariants, chunked_engine, random_model, serve_in_thread
from tests.test_chunked import check_chunked
from tests.test_paged import op  # noqa: F401  (loads the shared hypothesis profile)
from tinyllm.engine import ContinuousEngine, Request
from tinyllm.engine.solo import generate
from tinyllm.request import SEED_MAX, SEED_MIN, Sampling, fork_sampling

PROMPT = list(range(1, 21))  # 20 tokens: 2 full blocks of 8 and a partial one


def engine(
    model,
    n_slots: int = 4,
    block_size: int = 8,
    kv_blocks: int | None = None,
    budget: int = 64,
    prefix_cache: bool = True,
    max_len: int | None = None,
) -> ContinuousEngine:
    return chunked_engine(
        model, n_slots, max_len, block_size=block_size, budget=budget, kv_blocks=kv_blocks, prefix_cache=prefix_cache
    )


def run(eng: ContinuousEngine, on_step=None) -> None:
    while eng.has_work():
        eng.step()
        check_chunked(eng)
        if on_step is not None:
            on_step(eng)
    assert eng.slots.allocated_tokens() == 0 and not eng._running


def solo(model, req: Request, **kw) -> list[int]:
    """The request alone on a fresh engine."""
    eng = engine(model, **kw)
    rid = eng.add_request(req)
    run(eng)
    return eng.results[rid].tokens


# -- the engine ------------------------------------------------------------------------------------
@pytest.mark.parametrize("prefix_cache", [True, False])
@pytest.mark.parametrize("prompt_len", [20, 16])  # a partial last block (copied), and none
def test_the_prompt_is_prefilled_once_and_its_full_blocks_are_shared(model, prefix_cache, prompt_len):
    eng = engine(model, prefix_cache=prefix_cache)
    prompt = PROMPT[:prompt_len]
    rids = eng.add_forks(Request(prompt, 6, sampling=Sampling(1.0, seed=3)), 4)
    assert len(rids) == 4 and len(eng.waiting) == 1  # only the parent is queued
    seen = []

    def at_fork(eng):
        if not seen and all(eng._seqs[r].slot is not None for r in rids):
            tables = [eng.slots.tables[eng._seqs[r].slot] for r in rids]
            full = prompt_len // 8
            seen.append(tables)
            for b in tables[0][:full]:  # the prompt's full blocks: one copy, 4 refs
                assert eng.slots.ref[b] == 4 and all(t[:full] == tables[0][:full] for t in tables)
            partial = [t[full] for t in tables if len(t) > full]
            assert len(set(partial)) == len(partial)  # the partial block: each its own copy

    run(eng, at_fork)
    assert seen, "the samples never ran side by side"
    assert eng.stats.prefill_tokens == prompt_len
    forks = [e for e in eng.pop_lifecycle() if e.kind == "admitted" and e.reason == f"fork of #{rids[0]}"]
    assert sorted(e.rid for e in forks) == rids[1:]
    assert all(len(eng.results[r].tokens) == 6 for r in rids)


def test_the_fork_shows_in_the_event_log_and_the_timeline(model):
    """A sample's admission says whose fork it is; its track decodes from the step after."""
    from tinyllm.observe.timeline import Timeline
    from tui.runners.interface import lifecycle_log

    eng = engine(model)
    rids = eng.add_forks(Request(PROMPT, 4), 2)
    run(eng)
    events = eng.pop_lifecycle()
    fork = next(e for e in events if e.kind == "admitted" and e.rid == rids[1])
    assert lifecycle_log(fork) == (
        "admit",
        f"#{rids[1]} admitted to slot {fork.slot} as a fork of #{rids[0]}, sharing its prompt's blocks",
    )
    tl = Timeline()
    tl.feed(events)
    parent, child = tl.track(rids[0]), tl.track(rids[1])
    assert [(sp.phase, sp.start_step) for sp in child.spans][-2:] == [("prefill", fork.step), ("decode", fork.step + 1)]
    assert [sp.phase for sp in parent.spans][-1] == [sp.phase for sp in child.spans][-1] == "decode"


def test_each_seeded_sample_equals_its_seeded_solo_run(model):
    eng = engine(model)
    req = Request(PROMPT, 12, sampling=Sampling(0.9, top_k=50, seed=41))
    rids = eng.add_forks(req, 4)
    run(eng)
    got = [eng.results[r].tokens for r in rids]
    want = [solo(model, Request(PROMPT, 12, sampling=Sampling(0.9, top_k=50, seed=41 + i))) for i in range(4)]
    assert got == want and len({tuple(g) for g in got}) == 4
    assert [eng.snapshot().request(r).sampling.seed for r in rids] == [41, 42, 43, 44]


def test_greedy_samples_all_equal_greedy_solo(model):
    eng = engine(model)
    rids = eng.add_forks(Request(PROMPT, 10), 3)
    run(eng)
    want = generate(model, PROMPT, 10)
    assert [eng.results[r].tokens for r in rids] == [want] * 3


def test_other_schedulers_run_n_independent_requests(model):
    """The seed's scheduler has no forks: n requests, each seeded sample still its solo run."""
    eng = ContinuousEngine(model, 4, kv="slots")
    rids = eng.add_forks(Request(PROMPT, 8, sampling=Sampling(1.0, seed=5)), 3)
    assert len(eng.waiting) == 3
    while eng.has_work():
        eng.step()
        check_invariants(eng)
    assert eng.stats.prefill_tokens == 3 * len(PROMPT)
    assert [eng.results[r].tokens for r in rids] == [
        solo(model, Request(PROMPT, 8, sampling=Sampling(1.0, seed=5 + i))) for i in range(3)
    ]


def test_seeds_wrap_within_int64_and_bad_n_is_refused(model):
    assert fork_sampling(Sampling(1.0, seed=SEED_MAX), 2).seed == SEED_MIN + 1
    assert fork_sampling(Sampling(1.0), 3).seed is None
    eng = engine(model)
    for n in (0, 17, "2", 2.0, True):
        with pytest.raises(ValueError, match="n must be an integer from 1 to 16"):
            eng.add_forks(Request(PROMPT, 4), n)
    with pytest.raises(ValueError):
        eng.add_forks(Request(PROMPT, 500), 2)  # too long: nothing is queued
    assert not eng.has_work() and not eng._seqs


@pytest.mark.parametrize("n_slots, kv_blocks", [(2, None), (4, 3)])
def test_samples_without_a_slot_or_block_fall_back_to_ordinary_requests(model, n_slots, kv_blocks):
    """2 slots for 4 samples, or a pool the parent's prompt fills (3 blocks of 8 for 20 tokens):
    the samples that cannot fork queue at the front as ordinary requests, recompute (or hit the
    prefix cache), and still equal their seeded solo runs."""
    eng = engine(model, n_slots=n_slots, kv_blocks=kv_blocks)
    new = 2 if kv_blocks else 8
    rids = eng.add_forks(Request(PROMPT, new, sampling=Sampling(1.0, seed=9)), 4)
    run(eng)
    admitted = [e for e in eng.pop_lifecycle() if e.kind == "admitted"]
    forked = {e.rid for e in admitted if e.reason.startswith("fork of")}
    assert len(forked) == (n_slots - 1 if kv_blocks is None else 0)
    assert {e.rid for e in admitted} == set(rids)
    assert [eng.results[r].tokens for r in rids] == [
        solo(model, Request(PROMPT, new, sampling=Sampling(1.0, seed=9 + i))) for i in range(4)
    ]


@pytest.mark.parametrize("stage", ["queued", "mid_prefill"])
def test_aborting_the_parent_before_its_fork_hands_the_samples_to_the_next(model, stage):
    """The first waiting sample takes the parent's place: the prompt is still computed once
    (from the start: budget 8, so the parent was mid-prefill), the other samples fork off it."""
    eng = engine(model, n_slots=4, budget=8, prefix_cache=False)
    if stage == "queued":
        eng.add_request(Request(list(range(30, 40)), 2))  # ahead of it, takes the step's budget
    rids = eng.add_forks(Request(PROMPT, 6, sampling=Sampling(1.0, seed=20)), 3)
    eng.step()
    parent = eng._seqs[rids[0]]
    assert parent.forks and (parent.state == "queued") == (stage == "queued")
    assert eng.abort(rids[0])
    check_chunked(eng)
    heir = eng._seqs[rids[1]]
    assert heir in eng.waiting and [c.rid for c in heir.forks] == [rids[2]]
    run(eng)
    assert eng.results[rids[0]].state != "finished"
    assert [eng.results[r].tokens for r in rids[1:]] == [
        solo(model, Request(PROMPT, 6, sampling=Sampling(1.0, seed=20 + i))) for i in (1, 2)
    ]
    admitted = {e.rid: e.reason for e in eng.pop_lifecycle() if e.kind == "admitted"}
    assert admitted[rids[2]] == f"fork of #{rids[1]}"


def test_aborting_waiting_samples_and_all_of_them_leaves_nothing(model):
    eng = engine(model, budget=8)
    rids = eng.add_forks(Request(PROMPT, 6), 4)
    eng.step()
    assert eng.abort(rids[2]) and not eng.abort(rids[2])
    assert [c.rid for c in eng._seqs[rids[0]].forks] == [rids[1], rids[3]]
    assert eng.load() == (2, 1)  # the two still waiting for the prompt
    for r in (rids[0], rids[1], rids[3]):
        assert eng.abort(r)
        check_chunked(eng)
    assert not eng.has_work() and eng.slots.allocated_tokens() == 0
    assert {eng.snapshot().request(r).state for r in rids} == {"aborted"}


@pytest.mark.parametrize("end", ["finish", "fail"])
def test_finish_and_failure_of_a_parent_before_its_fork_hand_the_samples_on(model, end):
    eng = engine(model, budget=8)
    rids = eng.add_forks(Request(PROMPT, 5), 3)
    eng.step()
    if end == "finish":
        assert eng.finish(rids[0], 0)  # e.g. a stop string at once
    else:
        eng._fail(eng._seqs[rids[0]], "a failed forward")  # (what _isolated does to a culprit)
    run(eng)
    assert (eng.results[rids[0]].state == "finished") == (end == "finish")
    want = generate(model, PROMPT, 5)
    assert [eng.results[r].tokens for r in rids[1:]] == [want, want]
    assert eng.stats.prefill_tokens == len(PROMPT)  # the parent's first block came from the cache


# -- random schedules --------------------------------------------------------------------------------
_small = random_model(seed=1, vocab=48, d_model=32, n_layers=1, max_seq_len=64)


@functools.cache
def _solo_greedy(prompt: tuple, new: int, eos) -> list[int]:
    return generate(_small, list(prompt), new, eos_id=eos)


@functools.cache
def _solo_seeded(prompt: tuple, new: int, eos, seed: int) -> list[int]:
    eng = ContinuousEngine(_small, 1, 56, kv="paged", block_size=8, chunked_prefill=True, max_batched_tokens=64)
    rid = eng.add_request(Request(list(prompt), new, eos_id=eos, sampling=Sampling(1.0, seed=seed)))
    while eng.has_work():
        eng.step()
    return eng.results[rid].tokens


fork_op = st.tuples(
    st.just("fork"),
    st.lists(st.integers(0, 47), min_size=1, max_size=30),
    st.integers(1, 24),
    st.one_of(st.none(), st.integers(0, 47)),
    st.integers(1, 5),
    st.booleans(),
)
fork_ops = st.one_of(
    fork_op,
    st.tuples(
        st.just("add"),
        st.lists(st.integers(0, 47), min_size=1, max_size=30),
        st.integers(1, 24),
        st.one_of(st.none(), st.integers(0, 47)),
    ),
    st.tuples(st.just("abort"), st.integers(0, 60)),
    st.tuples(st.just("finish"), st.integers(0, 60)),
    st.tuples(st.just("step"), st.integers(1, 4)),
)


@settings(max_examples=100)
@given(
    n_slots=st.integers(1, 5),
    block_size=st.integers(1, 16),
    spare_blocks=st.integers(0, 6),
    extra_budget=st.sampled_from([0, 1, 6, 30, 200]),
    prefix_cache=st.booleans(),
    ops=st.lists(fork_ops, max_size=20),
)
def test_random_schedules_with_forks_keep_the_invariants(
    n_slots, block_size, spare_blocks, extra_budget, prefix_cache, ops
):
    """Forks mixed into random adds, aborts, finishes and steps: the invariants after every step,
    nothing held at the end, every greedy sample equal to solo, every seeded one to its seeded
    solo run."""
    max_len = 56
    eng = engine(
        _small,
        n_slots,
        block_size,
        -(-max_len // block_size) + spare_blocks,
        n_slots + extra_budget,
        prefix_cache,
        max_len,
    )
    want: dict[int, list[int]] = {}
    aborted: set[int] = set()
    for o in ops:
        if o[0] in ("add", "fork"):
            prompt, new, eos = o[1], min(o[2], max_len - len(o[1])), o[3]
            if o[0] == "add":
                want[eng.add_request(Request(prompt, new, eos_id=eos))] = _solo_greedy(tuple(prompt), new, eos)
                continue
            seeded = o[5]
            req = Request(prompt, new, eos_id=eos, sampling=Sampling(1.0, seed=7) if seeded else None)
            for i, rid in enumerate(eng.add_forks(req, o[4])):
                want[rid] = (_solo_seeded if seeded else _solo_greedy)(tuple(prompt), new, eos, *([7 + i] * seeded))
        elif o[0] == "abort":
            if eng.abort(o[1]):
                aborted.add(o[1])
        elif o[0] == "finish":  # a stop string: its tokens so far, cut
            if eng.finish(o[1]):
                want.pop(o[1], None)
        else:
            for _ in range(o[1]):
                eng.step()
                check_chunked(eng)
    run(eng)
    event(f"a fork seated: {any(e.kind == 'admitted' and e.reason.startswith('fork of') for e in eng.pop_lifecycle())}")
    for rid, w in want.items():
        if rid in aborted:
            assert eng.results[rid].state == "aborted"
            continue
        assert eng.results[rid].tokens == w, f"request {rid} differs"


# -- the server ---------------------------------------------------------------------------------------
MODEL = SERVED_MODEL


@pytest.fixture(scope="module")
def server(model_tok):
    s = serve_in_thread(*model_tok, slots=8)
    yield s
    s.stop()


def _idle_and_empty(server) -> None:
    """No request left, no block held, the invariants hold (read in the engine's thread)."""
    import time

    loop = server.engine_loop
    for _ in range(200):
        if not loop.call(lambda e: e.has_work()):
            break
        time.sleep(0.05)

    def check(e):
        check_invariants(e)
        return e.slots.allocated_tokens(), e.has_work()

    assert loop.call(check) == (0, False)


def _oa(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", timeout=60, max_retries=0)


def test_openai_client_completions_n_streaming_and_not(server, model_tok):
    _, tok = model_tok
    oa = _oa(server)
    kw = dict(model=MODEL, prompt="ROMEO:\n", max_tokens=12, temperature=1.0, seed=100)
    r = oa.completions.create(**kw, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    solo_texts = [oa.completions.create(**{**kw, "seed": 100 + i}).choices[0].text for i in range(3)]
    assert [c.text for c in r.choices] == solo_texts and len(set(solo_texts)) > 1
    prompt_tokens = len(tok.encode("ROMEO:\n"))
    assert r.usage.prompt_tokens == prompt_tokens and r.usage.completion_tokens == 36
    texts, usage, finished = ["", "", ""], None, set()
    for chunk in oa.completions.create(**kw, n=3, stream=True, stream_options={"include_usage": True}):
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.finish_reason:
                finished.add(c.index)
        usage = chunk.usage or usage
    assert texts == solo_texts and finished == {0, 1, 2}
    assert usage.prompt_tokens == prompt_tokens and usage.completion_tokens == 36
    _idle_and_empty(server)
    lines = httpx.get(server.url + "/metrics").text.splitlines()  # forks looked nothing up in the cache
    queries = next(float(x.split()[-1]) for x in lines if x.startswith("vllm:prefix_cache_queries_total"))
    assert queries == server.engine_loop.call(lambda e: e.snapshot().counters.prefix_queries)


def test_openai_client_chat_n_streaming_and_not(server):
    oa = _oa(server)
    kw = dict(
        model=MODEL, messages=[{"role": "user", "content": "Good morrow."}], max_tokens=10, temperature=0.8, seed=5
    )
    r = oa.chat.completions.create(**kw, n=2)
    assert [c.index for c in r.choices] == [0, 1] and all(c.message.role == "assistant" for c in r.choices)
    solo_texts = [oa.chat.completions.create(**{**kw, "seed": 5 + i}).choices[0].message.content for i in range(2)]
    assert [c.message.content for c in r.choices] == solo_texts
    assert r.usage.completion_tokens == 20
    texts, roles = ["", ""], set()
    for chunk in oa.chat.completions.create(**kw, n=2, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.delta.role:
                roles.add(c.index)
    assert texts == solo_texts and roles == {0, 1}
    _idle_and_empty(server)


def test_n_with_stop_strings_logprobs_and_greedy(server):
    """Each choice has its own stop-string reader and logprobs; greedy choices are identical."""
    with httpx.Client(base_url=server.url, timeout=60) as c:
        body = {
            "model": MODEL,
            "prompt": "HAMLET:\nTo be, or not",
            "max_tokens": 16,
            "temperature": 0,
            "n": 3,
            "logprobs": 1,
            "stop": [" the"],
        }
        r = c.post("/v1/completions", json=body).json()
        one = c.post("/v1/completions", json={**body, "n": 1}).json()["choices"][0]
        assert [ch["text"] for ch in r["choices"]] == [one["text"]] * 3
        assert all(ch["logprobs"]["tokens"] == one["logprobs"]["tokens"] for ch in r["choices"])
        assert all(ch["finish_reason"] == one["finish_reason"] for ch in r["choices"])
        assert r["usage"]["completion_tokens"] == 3 * len(one["logprobs"]["tokens"])
    _idle_and_empty(server)


@pytest.mark.parametrize(
    "route, extra",
    [("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})],
)
def test_bad_n_is_a_400_naming_n(server, route, extra):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        for n in (0, 17, "x", 1.5, True, -1):
            r = c.post(route, json={"model": MODEL, **extra, "n": n})
            assert r.status_code == 400 and r.json()["error"]["param"] == "n", (n, r.text)
        if route == "/v1/completions":  # (chat has no best_of)
            r = c.post(route, json={"model": MODEL, **extra, "best_of": 3})
            assert r.status_code == 400 and r.json()["error"]["param"] == "best_of"


def test_a_client_that_goes_away_aborts_every_sample(server):
    body = {"model": MODEL, "prompt": "KING LEAR:\n", "max_tokens": 300, "ignore_eos": True, "n": 4, "stream": True}
    with httpx.Client(base_url=server.url, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            rids = [int(x) for x in r.headers["x-tinyllm-request-id"].split(",")]
            got = 0
            for line in r.iter_lines():
                if line.startswith("data: "):
                    assert json.loads(line[6:])["choices"][0]["index"] in range(4)
                    got += 1
                if got >= 8:
                    break
    assert len(rids) == 4
    _idle_and_empty(server)
    states = server.engine_loop.call(lambda e: [e.snapshot().request(r).state for r in rids])
    assert states == ["aborted"] * 4


async def test_the_app_sends_n_samples_as_forks_and_the_block_map_shows_them_shared():
    """A prompt file's (or the app's) n: one prompt, n requests, the prompt's full blocks shared."""

    from tests.screen_check import check_panels
    from tests.test_app import bundled, step, submit, until, watched_app
    from tinyllm.request import RequestSettings, Sampling

    model, tok = bundled()
    eng = chunked_engine(model, 4, 128, block_size=4, budget=64, seeded=True)
    app = watched_app(eng, tok, settings=RequestSettings(Sampling(temperature=0.8, seed=7), 6, n=3))
    async with app.run_test(size=(120, 40)) as pilot:
        await submit(pilot, "ROMEO:\nWhat light through yonder window breaks?\n")
        await until(pilot, lambda: len(app.runner.frame.snapshot.requests) == 3, what="three samples")
        await step(pilot, 1)
        snap = app.runner.frame.snapshot
        assert [v.state for v in snap.requests] == ["running"] * 3
        assert max(snap.kv.block_refs) == 3  # the prompt's full blocks, shared by all three
        assert snap.counters.prefill_tokens == len(snap.requests[0].prompt)
        app.refresh_from_runner(force=True)
        await pilot.pause()
        check_panels(app)
