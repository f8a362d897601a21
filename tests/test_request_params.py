"""Issue 24 in the engine: a seeded request's tokens do not depend on the batch (solo, batched,
preempted and recomputed, served from the prefix cache); stop_token_ids and min_tokens in the
stop rule; logprobs recorded only for requests that ask; finish() for a matched stop string."""

from __future__ import annotations

import re

import pytest

from tests.helpers import check_invariants, chunked_engine, random_model, run_checked
from tinyllm.engine import Request, Sampling
from tinyllm.request import SamplingError

SEEDED = [
    Sampling(1.0, seed=11),
    Sampling(0.8, top_k=20, seed=12),
    Sampling(1.2, top_p=0.9, seed=-5),
    Sampling(1.0, min_p=0.05, seed=2**63 - 1),
    Sampling(1.0, repetition_penalty=1.3, seed=0),
    Sampling(0.9, presence_penalty=0.7, frequency_penalty=0.4, seed=99),
]
HEADER = list(range(40, 60))  # a shared prefix: 5 blocks of 4


@pytest.fixture(scope="module")
def model():
    return random_model(seed=3)


def paged(model, n_slots=6, kv_blocks=None, block_size=4, prefix_cache=True):
    return chunked_engine(
        model, n_slots, 128, block_size=block_size, budget=32, kv_blocks=kv_blocks, prefix_cache=prefix_cache
    )


def seeded_requests() -> list[Request]:
    return [Request(HEADER + [i + 1, 2 * i + 3], 24 + 3 * i, sampling=s) for i, s in enumerate(SEEDED)]


def noise() -> list[Request]:
    """Unseeded sampled requests that share the batch (their draws come from the shared generator)."""
    return [Request([7 + i] * (3 + i), 30, sampling=Sampling(1.0)) for i in range(5)]


def divergences(got: list[list[int]], want: list[list[int]]) -> int:
    """Requests whose tokens differ. Only a near-tie may flip a draw (a uniform that falls within
    float noise of a CDF boundary, as near-equal logits flip greedy), so this must stay ~0."""
    return sum(g != w for g, w in zip(got, want))


def test_seeded_tokens_do_not_depend_on_the_batch(model):
    reqs = seeded_requests()
    solo = [run_checked(paged(model, prefix_cache=False), [r])[0] for r in reqs]
    assert len({tuple(s) for s in solo}) == len(solo)
    batched = run_checked(paged(model), reqs + noise())[: len(reqs)]
    eng = paged(model, n_slots=6, kv_blocks=30)  # tight pool: preempted and recomputed
    tight = run_checked(eng, noise()[:2] + reqs)[2:]
    assert eng.stats.preemptions >= 2
    eng = paged(model)  # prefix cache: the header comes from cache
    warm = run_checked(eng, [Request(HEADER + [1, 3], 2)])
    rids = [eng.add_request(r) for r in reqs]
    while eng.has_work():
        eng.step()
        check_invariants(eng)
    cached = [eng.results[r].tokens for r in rids]
    assert warm and all(eng.snapshot().request(r).cached_tokens >= 16 for r in rids)
    counts = {
        name: divergences(got, solo)
        for name, got in (("batched", batched), ("preempted", tight), ("prefix cache", cached))
    }
    print("seeded divergences from solo:", counts)
    assert sum(counts.values()) <= 1, counts


def test_an_unseeded_request_depends_on_the_shared_generator(model):
    """The control: without a seed, the same request in another batch draws other tokens."""
    r = Request([5, 6, 7], 30, sampling=Sampling(1.0))
    alone = run_checked(paged(model), [r])[0]
    batched = run_checked(paged(model), noise() + [r])[-1]
    assert alone != batched


def test_stop_token_ids_end_a_request_with_reason_stop(model):
    free = run_checked(paged(model), [Request([1, 2, 3], 30)])[0]
    stop = free[7]
    first = free.index(stop)
    eng = paged(model)
    rid = eng.add_request(Request([1, 2, 3], 30, stop_token_ids=[stop, 255]))
    events = []
    while eng.has_work():
        events += eng.step()
    assert eng.results[rid].tokens == free[: first + 1]
    assert events[-1].done and events[-1].reason == "stop"
    fin = [e for e in eng.pop_lifecycle() if e.kind == "finished"]
    assert fin[0].reason == "stop"


def test_min_tokens_bans_eos_and_stop_ids_until_reached(model):
    free = run_checked(paged(model), [Request([1, 2, 3], 30)])[0]
    eos, stop = free[2], free[4]
    eng = paged(model)
    early = eng.add_request(Request([1, 2, 3], 30, eos_id=eos))
    late = eng.add_request(Request([1, 2, 3], 30, eos_id=eos, stop_token_ids=[stop], min_tokens=12))
    while eng.has_work():
        eng.step()
    assert eng.results[early].tokens == free[:3]
    out = eng.results[late].tokens
    assert len(out) >= 12 and eos not in out[:12] and stop not in out[:12]
    assert out[:2] == free[:2]  # the same until the first banned choice


def test_logprobs_only_for_requests_that_ask(model):
    eng = paged(model)
    a = eng.add_request(Request([1, 2, 3], 8, logprobs=4))
    b = eng.add_request(Request([4, 5], 8))
    c = eng.add_request(Request([4, 5, 6], 8, sampling=Sampling(1.0, seed=1), logprobs=0))
    events = []
    while eng.has_work():
        events += eng.step()
    for e in events:
        if e.rid == b:
            assert e.logprob is None
        else:
            assert e.logprob is not None and e.logprob.token == e.token
            assert len(e.logprob.top) == (4 if e.rid == a else 0)
        if e.rid == a:  # greedy: the chosen token is the top one
            assert e.logprob.top[0] == (e.token, e.logprob.logprob)
            assert [v for _, v in e.logprob.top] == sorted((v for _, v in e.logprob.top), reverse=True)
    assert len(eng._seqs[a].logprobs) == 8 and len(eng._seqs[c].logprobs) == 8 and not eng._seqs[b].logprobs


def test_finish_keeps_the_tokens_before_the_stop_and_frees_everything(model):
    eng = paged(model, n_slots=2)
    a = eng.add_request(Request([1, 2, 3], 40, logprobs=1))
    b = eng.add_request(Request([4, 5, 6], 40))
    q = eng.add_request(Request([7, 8], 40))  # queued: finish works there too
    for _ in range(6):
        eng.step()
    assert eng.finish(a, keep=3) and eng.finish(q)
    assert not eng.finish(a) and not eng.finish(12345) and not eng.finish("x")
    check_invariants(eng)
    assert len(eng.results[a].tokens) == 3 and len(eng._seqs[a].logprobs) == 3
    assert eng.snapshot().request(a).state == "finished"
    fin = [e for e in eng.pop_lifecycle() if e.kind == "finished"]
    assert [(e.rid, e.reason, e.tokens) for e in fin] == [(a, "stop", 3), (q, "stop", 0)]
    while eng.has_work():
        eng.step()
    assert len(eng.results[b].tokens) == 40 and eng.slots.allocated_tokens() == 0


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"stop_token_ids": "7"}, "stop_token_ids"),
        ({"min_tokens": 11}, "min_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
    ],
)
def test_bad_request_fields_name_the_field(kwargs, field):
    with pytest.raises(SamplingError) as e:
        Request([1, 2], 10, **kwargs)
    assert e.value.field == field


def test_a_stop_token_id_outside_the_vocabulary_is_refused_at_add(model):
    with pytest.raises(SamplingError, match="outside the model's vocabulary"):
        paged(model).add_request(Request([1, 2], 4, stop_token_ids=[256]))


def test_prompt_files_take_the_new_fields(tmp_path):
    from tinyllm.request import RequestSettings
    from tinyllm.workload import WorkloadError, load_workload, tokenize_checked

    f = tmp_path / "w.jsonl"
    f.write_text(
        '{"prompt": "a", "temperature": 0.7, "seed": 3, "min_p": 0.1, "repetition_penalty": 1.2, '
        '"stop": ["\\n\\n", "END"], "stop_token_ids": [4], "min_tokens": 2}\n{"prompt": "b"}\n'
    )
    a, b = load_workload(f)
    defaults = RequestSettings(Sampling(0.5), 20, stop=("x",), min_tokens=1)
    sa, sb = a.settings(defaults), b.settings(defaults)
    assert sa.sampling == Sampling(0.7, min_p=0.1, repetition_penalty=1.2, seed=3)
    assert (sa.stop, sa.stop_token_ids, sa.min_tokens, sa.max_new_tokens) == (("\n\n", "END"), (4,), 2, 20)
    assert sb == defaults  # what a line leaves out: the caller's
    req = sa.request([1, 2], eos_id=0)
    assert (req.stop_token_ids, req.min_tokens, req.sampling.seed) == ((4,), 2, 3)
    for line, says in (
        ('{"prompt": "a", "seed": 1.5}', "seed must be an integer"),
        ('{"prompt": "a", "presence_penalty": 3}', "presence_penalty must be a number in [-2, 2]"),
        ('{"prompt": "a", "stop": [1]}', "stop must be a string or a list of strings"),
        ('{"prompt": "a", "max_new_tokens": 2, "min_tokens": 3}', "min_tokens must be"),
        ('{"prompt": "a", "stop_token_ids": [-4]}', "stop_token_ids must be"),
    ):
        f.write_text(line + "\n")
        with pytest.raises(WorkloadError, match=rf"w.jsonl:1: {re.escape(says)}"):
            load_workload(f)
    f.write_text('{"prompt": "a", "min_tokens": 30}\n')
    with pytest.raises(WorkloadError, match="min_tokens 30 is more than max_new_tokens 20"):
        tokenize_checked(load_workload(f), f, lambda s: [1], 64, 20)


def test_an_attached_app_sends_the_new_fields_only_when_set():
    from tinyllm.request import RequestSettings
    from tui.runners.interface import Submit
    from tui.runners.server_link import completion_body

    plain = completion_body(Submit("x", RequestSettings(Sampling(0.5), 10)))
    assert set(plain) == {"prompt", "max_tokens", "temperature", "stream"}
    s = RequestSettings(
        Sampling(0.5, min_p=0.1, presence_penalty=-1, frequency_penalty=0.5, repetition_penalty=1.3, seed=9),
        10,
        stop=("\n\n",),
        stop_token_ids=(3,),
        min_tokens=2,
    )
    body = completion_body(Submit("x", s))
    want = {
        "min_p": 0.1,
        "presence_penalty": -1,
        "frequency_penalty": 0.5,
        "repetition_penalty": 1.3,
        "seed": 9,
        "stop": ["\n\n"],
        "stop_token_ids": [3],
        "min_tokens": 2,
    }
    assert {k: body[k] for k in want} == want
