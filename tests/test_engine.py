"""Engine core: batched greedy output equals solo generate(), sampling, abort, bad input."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import check_invariants, engine_workload, run_checked
from tinyllm.engine import ContinuousEngine, Request, Sampling, run_continuous, run_static
from tinyllm.engine.sampler import sample_next
from tinyllm.engine.solo import generate


@pytest.fixture(scope="module")
def workload(model):
    return engine_workload(28)  # (on random_model(), the model fixture's weights)


def test_workload_has_early_eos(workload):
    reqs, solo = workload
    early = [r for r, s in zip(reqs, solo) if len(s) < r.max_new_tokens]
    assert early and all(s[-1] == r.eos_id for r, s in zip(reqs, solo) if len(s) < r.max_new_tokens)


def test_static_equals_solo(model, workload):
    reqs, solo = workload
    results, summary = run_static(model, reqs, batch_size=4)
    assert [r.tokens for r in results] == solo
    assert summary["useful_tokens"] == sum(map(len, solo))
    assert summary["row_util"] < 1.0  # static batching wastes rows


@pytest.mark.parametrize("n_slots", [4, 7])
def test_continuous_equals_solo(model, workload, n_slots):
    reqs, solo = workload
    results, summary = run_continuous(model, reqs, n_slots)
    assert [r.tokens for r in results] == solo
    assert summary["kv_allocated_at_end"] == 0
    assert summary["peak_active"] == n_slots
    assert all(0 <= r.ttft_s <= r.latency_s for r in results)


def test_engine_invariants_every_step(model, workload):
    reqs, solo = workload
    eng = ContinuousEngine(model, 5)
    assert run_checked(eng, reqs) == solo


def test_requests_arriving_while_others_decode(model, workload):
    reqs, solo = workload
    eng = ContinuousEngine(model, 3)
    rids = {}
    for i, r in enumerate(reqs):
        rids[eng.add_request(r)] = i
        eng.step()  # one arrival per step
        check_invariants(eng)
    while eng.has_work():
        eng.step()
    assert {rids[k]: v.tokens for k, v in eng.results.items()} == dict(enumerate(solo))


def test_events_stream_every_token(model, workload):
    reqs, solo = workload
    eng = ContinuousEngine(model, 4)
    rids = [eng.add_request(r) for r in reqs[:8]]
    streamed = {r: [] for r in rids}
    done = set()
    while eng.has_work():
        for ev in eng.step():
            assert ev.rid not in done
            streamed[ev.rid].append(ev.token)
            if ev.done:
                done.add(ev.rid)
    assert done == set(rids)
    assert [streamed[r] for r in rids] == solo[:8]


# -- sampling -----------------------------------------------------------------------------


def test_sample_next_greedy_top_k_1_and_tiny_top_p_equal_argmax():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 50, generator=g) * 3
    greedy = logits.argmax(-1, keepdim=True)
    assert torch.equal(sample_next(logits), greedy)
    assert torch.equal(sample_next(logits, 1.5, top_k=1, generator=g), greedy)
    assert torch.equal(sample_next(logits, 1.5, top_p=1e-6, generator=g), greedy)


def test_top_k_only_draws_the_k_most_likely():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 40, generator=g)
    allowed = torch.topk(logits, 5, dim=-1).indices
    for _ in range(200):
        tok = sample_next(logits, 2.0, top_k=5, generator=g)
        assert all(tok[i, 0] in allowed[i] for i in range(4))


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(2)
    drawn = {int(sample_next(logits, 1.0, top_p=0.7, generator=g)) for _ in range(300)}
    assert drawn == {0, 1}  # 0.5 < 0.7 <= 0.5 + 0.3


def test_mixed_sampling_in_one_engine(model, workload):
    reqs, solo = workload
    settings = [
        None,
        Sampling(0.9, top_k=8),
        Sampling(1.2, top_p=0.5),
        Sampling(0.7, top_k=1),
        Sampling(1.0, top_p=1e-9),
    ]
    mixed = [Request(r.prompt, r.max_new_tokens, r.eos_id, settings[i % len(settings)]) for i, r in enumerate(reqs)]

    def run(seed):
        eng = ContinuousEngine(model, 6, generator=torch.Generator().manual_seed(seed))
        return run_checked(eng, mixed)

    out = run(123)
    for i, (r, o) in enumerate(zip(mixed, out)):
        if r.sampling is None or r.sampling.top_k == 1 or (r.sampling.top_p or 1) < 1e-6:
            assert o == solo[i], f"request {i} ({r.sampling}) should be greedy"
    assert run(123) == out  # a fixed generator reproduces
    sampled = [i for i, r in enumerate(mixed) if r.sampling and r.sampling.top_k == 8 and len(solo[i]) > 5]
    assert any(out[i] != solo[i] for i in sampled)  # temperature really samples


def test_top_k_respected_inside_the_engine(model):
    """With temperature > 0 and top_k = k, each drawn token is among the k most likely for its context."""
    prompt = [3, 14, 15, 92, 65]
    k = 3
    eng = ContinuousEngine(model, 2, generator=torch.Generator().manual_seed(5))
    eng.add_request(Request(prompt, 30, sampling=Sampling(1.5, top_k=k)))
    eng.add_request(Request([7, 7, 7], 30))  # a greedy neighbour in the batch
    while eng.has_work():
        eng.step()
    toks = eng.results[0].tokens
    for i, t in enumerate(toks):
        logits, _ = model(torch.tensor([prompt + toks[:i]]))
        assert t in torch.topk(logits[0, -1], k).indices.tolist()


# -- abort --------------------------------------------------------------------------------


@pytest.mark.parametrize("kv", ["slots", "paged"])
def test_abort_queued_and_running(model, workload, kv):
    reqs, solo = workload
    eng = ContinuousEngine(model, 3, kv=kv)
    rids = [eng.add_request(r) for r in reqs[:8]]
    eng.step()
    running = next(r for r in rids if eng._seqs[r].state == "running" and solo[r] and len(solo[r]) > 2)
    queued = rids[-1]
    assert eng._seqs[queued].state == "queued"
    used_before = eng.slots.used_tokens()
    assert eng.abort(running) and eng.abort(queued)
    assert not eng.abort(running) and not eng.abort(999)
    assert eng.slots.used_tokens() < used_before
    check_invariants(eng)
    assert eng.load()[1] == 2
    while eng.has_work():
        eng.step()
        check_invariants(eng)
    assert eng.results[running].state == eng.results[queued].state == "aborted"
    for r in rids:
        if r not in (running, queued):
            assert eng.results[r].tokens == solo[r]
    assert eng.slots.allocated_tokens() == 0
    snap = eng.snapshot()
    assert snap.request(running).state == "aborted" and snap.request(queued).state == "aborted"
    assert snap.counters.aborted == 2


# -- snapshot -----------------------------------------------------------------------------


def test_snapshot_tracks_states_and_kv(model, workload):
    reqs, solo = workload
    eng = ContinuousEngine(model, 2)
    for r in reqs[:4]:
        eng.add_request(r)
    snap0 = eng.snapshot()
    assert [v.state for v in snap0.requests] == ["queued"] * 4 and snap0.queue == (0, 1, 2, 3)
    assert snap0.kv.used_tokens == 0 and all(s.free for s in snap0.slots)
    eng.step()
    snap = eng.snapshot()
    held = {s.rid: s for s in snap.slots if not s.free}
    assert snap.num_requests_running == len(held) and snap.num_requests_waiting == len(snap.queue)
    for rid, sv in held.items():
        rv = snap.request(rid)
        assert rv.state == "running" and rv.slot == sv.slot
        assert sv.context_len == len(rv.prompt) + len(rv.tokens) - 1  # last token not yet fed back
        assert list(rv.tokens) == solo[rid][: len(rv.tokens)]
    assert snap.kv.used_tokens == sum(s.context_len for s in snap.slots)
    assert snap.kv.reserved_tokens == 2 * eng.max_len
    assert snap0.requests[0].tokens == ()  # old snapshots are not mutated
    while eng.has_work():
        eng.step()
    end = eng.snapshot()
    assert all(v.state == "finished" for v in end.requests)
    assert [list(v.tokens) for v in end.requests] == solo[:4]
    assert end.counters.finished == 4 and end.counters.useful_tokens == sum(map(len, solo[:4]))
    assert all(v.ttft_s is not None and v.latency_s >= v.ttft_s for v in end.requests)


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(temperature="hot"), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=-1), "top_p"),
    ],
)
def test_bad_sampling_names_field_and_range(kwargs, field):
    with pytest.raises(ValueError, match=field) as e:
        Sampling(**kwargs)
    assert any(s in str(e.value) for s in (">= 0", ">= 1", "(0, 1]"))


@pytest.mark.parametrize(
    "args, field",
    [
        (([], 5), "prompt"),
        (([1, -2], 5), "prompt"),
        (([1, 2], 0), "max_new_tokens"),
        (([1, 2], 2.0), "max_new_tokens"),
        (([1], 3, -1), "eos_id"),
    ],
)
def test_bad_request_names_field(args, field):
    with pytest.raises(ValueError, match=field):
        Request(*args)


def test_prompt_that_cannot_fit_is_refused_at_add(model):
    eng = ContinuousEngine(model, 2, max_len=64)
    with pytest.raises(
        ValueError, match=r"prompt is 60 tokens \+ max_new_tokens 10 = 70, more than the slot's max_len of 64 tokens"
    ):
        eng.add_request(Request([1] * 60, 10))
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        eng.add_request(Request([1, 999], 3))
    assert not eng.has_work() and eng.snapshot().requests == ()


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        (dict(n_slots=0), "n_slots"),
        (dict(n_slots=2, max_len=10_000), "max_len"),
        (dict(n_slots=2, kv="disk"), "kv must be"),
        (dict(n_slots=2, kv="paged", block_size=0), "block_size"),
        (dict(n_slots=2, kv="paged", kv_blocks=0), "kv_blocks"),
        (dict(n_slots=2, kv="paged", cuda_graph=True), "cuda_graph supports kv='slots' only"),
    ],
)
def test_bad_engine_arguments(model, kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        ContinuousEngine(model, **kwargs)


def test_static_refuses_per_request_sampling(model):
    with pytest.raises(ValueError, match="per-request sampling"):
        run_static(model, [Request([1, 2], 3, sampling=Sampling(0.5))], 2)


def test_generate_refuses_overlong(model):
    with pytest.raises(ValueError, match="more than the model's max_seq_len of"):
        generate(model, [1] * 100, 100)
