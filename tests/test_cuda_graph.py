"""CUDA-graph decoder. On CPU: the refusals, the bucket rules, the full-slot error and that
capture leaves the cache's host state alone. On CUDA (marked ``cuda``): graph and eager give the
same greedy tokens in float32, logits within bf16 noise under autocast, and a decoder is reusable.

The guarantee (kv/cuda_graph.py): eager attends a window of longest + 1, the graph a whole
bucket, so the two run attention at different shapes; in float32 that is summation order only
(tokens equal), in bf16 it is rounding (logits close, a near-tie may flip)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from tests.helpers import mixed_workload, random_model, solo_outputs
from tinyllm.engine import ContinuousEngine, Request, run_continuous
from tinyllm.engine.solo import generate
from tinyllm.kv.cuda_graph import SlotGraphDecoder, capturing, check_buckets, default_buckets
from tinyllm.kv.dense import SlotKVCache
from tinyllm.model.device import autocast, full_precision


def slot_cache(model, n_slots: int = 3, max_len: int = 64, dtype=torch.float32, device="cpu") -> SlotKVCache:
    cfg = model.cfg
    return SlotKVCache(cfg.n_layers, n_slots, cfg.n_kv_heads, cfg.head_dim, max_len, dtype, device)


# -- CPU: refusals and the rules that need no GPU -------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on machines without CUDA")
def test_graphs_without_cuda_raise_a_clear_error():
    with pytest.raises(ValueError, match="cuda_graph needs a CUDA device"):
        ContinuousEngine(random_model(), 2, cuda_graph=True)


def test_graphs_with_paged_kv_are_refused():
    with pytest.raises(ValueError, match="kv='slots' only"):
        ContinuousEngine(random_model(), 2, kv="paged", cuda_graph=True)


def test_buckets_are_integers_in_one_to_max_len_and_cover_it():
    assert check_buckets(None, 300) == default_buckets(300) == (64, 128, 256, 300)
    assert check_buckets((64, 16, 64, 32), 64) == (16, 32, 64)
    for bad, why in [
        ((0, 64), "got 0"),
        ((32, 65), "got 65"),
        ((-1, 64), "got -1"),
        ((True, 64), "got True"),
        ((16.0, 64), "got 16.0"),
        ((16, 32), "must cover max_len 64; largest is 32"),
        ((), "must not be empty"),
    ]:
        with pytest.raises(ValueError, match=why.replace(".", r"\.")):
            check_buckets(bad, 64)


def test_bad_buckets_are_refused_before_anything_is_captured(model):
    """Checked at construction (before the CUDA check, so also here), not at capture."""
    with pytest.raises(ValueError, match=r"buckets must be integers in \[1, 64\] \(max_len\), got 0"):
        ContinuousEngine(model, 2, max_len=64, cuda_graph=True, buckets=(0, 64))
    with pytest.raises(ValueError, match="got 128"):
        SlotGraphDecoder(model, slot_cache(model), buckets=(32, 128))


def test_capture_needs_every_slot_idle_for_any_cache(model):
    """Not only a decoder handed to the engine: any cache with an active slot is refused."""
    s = slot_cache(model)
    s.lens[1], s.active[1] = 5, True
    with pytest.raises(ValueError, match="capture needs every slot idle; 1 of 3 are active"):
        SlotGraphDecoder(model, s)


def test_capture_leaves_the_host_state_alone(model):
    """What ``_capture`` runs inside ``capturing``: two warm-ups and the captured pass, each a
    forward that ends with ``cache.end``. Inside, the window is the bucket and the device lengths
    stay put (the graph reads them); after, lengths, activity and device lengths are as before."""
    s = slot_cache(model, n_slots=3, max_len=64)
    s.lens[:2], s.active[:2] = [5, 9], [True, True]
    s._sync_lens()
    tok = torch.zeros(3, 1, dtype=torch.long)
    with torch.no_grad(), capturing(s, 32):
        for _ in range(3):
            model(tok, cache=s)
            assert s._window == 32
        assert s.lens[:2] == [8, 12]  # each pass's cache.end ran
        assert s._lens_t.tolist() == [5, 9, 0]
    assert s.lens == [5, 9, 0] and s.active == [True, True, False]
    assert s._lens_t.tolist() == [5, 9, 0]
    assert s.window_override is None and not s.defer_sync


def test_capture_restores_the_host_state_when_a_pass_fails(model):
    s = slot_cache(model, n_slots=2, max_len=64)
    s.lens[0], s.active[0] = 7, True
    with pytest.raises(RuntimeError, match="boom"), capturing(s, 16):
        s.end(1)
        raise RuntimeError("boom")
    assert s.lens == [7, 0] and s.window_override is None and not s.defer_sync


def fake_decoder(slots: SlotKVCache) -> SlotGraphDecoder:
    """A decoder with no graphs (none can be captured without CUDA): enough for what ``step``
    must refuse before it replays anything."""
    dec = SlotGraphDecoder.__new__(SlotGraphDecoder)
    dec.slots, dec.buckets, dec._graphs = slots, check_buckets(None, slots.max_len), {}
    return dec


def test_a_full_slot_is_the_eager_paths_value_error_not_stop_iteration(model):
    s = slot_cache(model, n_slots=2, max_len=64)
    s.lens[1], s.active[1] = 64, True
    s._sync_lens()
    tok = torch.zeros(2, 1, dtype=torch.long)
    with pytest.raises(ValueError) as eager:
        model(tok, cache=s)
    with pytest.raises(ValueError) as graph:
        fake_decoder(s).step(tok)
    assert str(graph.value) == str(eager.value) == "SlotKVCache: a slot is full (64 of max_len 64)"
    assert s.lens == [0, 64]  # nothing advanced
    with pytest.raises(ValueError, match="no bucket covers an attention window of 65"):
        fake_decoder(s).bucket_for(65)
    assert [fake_decoder(s).bucket_for(w) for w in (1, 64)] == [64, 64]


# -- CUDA ------------------------------------------------------------------------------------------
F32 = dict(kv_cache_dtype="float32")


@pytest.mark.cuda
def test_graph_and_eager_give_the_same_greedy_tokens_in_float32():
    """And both equal solo ``generate`` (float32 compute and K/V): buckets small enough that the
    runs cross several."""
    model = random_model().cuda()
    reqs = mixed_workload(24)
    with full_precision():
        solo = [generate(model, r.prompt, r.max_new_tokens, eos_id=r.eos_id, **F32) for r in reqs]
        eager, _ = run_continuous(model, reqs, 5, max_len=128, **F32)
        graph, _ = run_continuous(model, reqs, 5, max_len=128, cuda_graph=True, buckets=(16, 32, 64, 128), **F32)
    assert [r.tokens for r in graph] == [r.tokens for r in eager] == solo


def both_ways(model, eng: ContinuousEngine) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step's logits (S, V) from the engine's current state, eager and replayed; the
    host lengths put back after each (their K/V writes land where the next real step writes)."""
    s, last = eng.slots, eng.runner.last_tok
    lens = list(s.lens)
    with torch.no_grad(), autocast(s.device):
        eager = model(last, cache=s)[0][:, -1].float()
    s.lens[:] = lens
    s._sync_lens()
    graph = eng.decoder.step(last)[:, -1].float().clone()
    s.lens[:] = lens
    s._sync_lens()
    return eager, graph


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_each_replayed_step_is_the_eager_step_within_the_precisions_noise(precision):
    """Step by step from the same state, across the buckets 8..128. float32: logits to float
    noise and the same argmax on every active row. bf16 autocast: every logit within 5% of the
    step's largest (a wrong mask, position or window moves them by their whole scale)."""
    model = random_model().cuda()
    reqs = [Request(list(range(1, 1 + n)), 50) for n in (3, 10, 17, 25)]
    kw = F32 if precision == "float32" else {}
    with full_precision() if precision == "float32" else contextlib.nullcontext():
        eng = ContinuousEngine(model, 4, 128, cuda_graph=True, buckets=(8, 16, 32, 64, 128), **kw)
        for r in reqs:
            eng.add_request(r)
        eng.step()  # admit and prefill all four
        for _ in range(40):
            active = [i for i, a in enumerate(eng.slots.active) if a]
            assert len(active) == 4
            eager, graph = both_ways(model, eng)
            if precision == "float32":
                torch.testing.assert_close(graph[active], eager[active], atol=1e-4, rtol=1e-4)
                assert torch.equal(graph[active].argmax(-1), eager[active].argmax(-1))
            else:
                scale = eager[active].abs().max()
                assert (graph[active] - eager[active]).abs().max() <= 0.05 * scale
            eng.step()


@pytest.mark.cuda
def test_graph_decode_under_bf16_mostly_equals_solo():
    """The default CUDA precision: tokens equal solo for nearly every request (a bf16 near-tie
    may flip one token, and the rest of that request follows it)."""
    model = random_model().cuda()
    reqs = mixed_workload(24)
    solo = solo_outputs(model, reqs)
    graph, _ = run_continuous(model, reqs, 5, cuda_graph=True)
    assert sum(r.tokens == s for r, s in zip(graph, solo)) >= 22


@pytest.mark.cuda
def test_decoder_is_reusable_across_engines():
    model = random_model().cuda()
    slots = slot_cache(model, n_slots=3, max_len=128, dtype=torch.bfloat16, device="cuda")
    dec = SlotGraphDecoder(model, slots)
    reqs = mixed_workload(6)
    a, _ = run_continuous(model, reqs, 3, max_len=128, cuda_graph=dec)
    b, _ = run_continuous(model, reqs, 3, max_len=128, cuda_graph=dec)
    assert [r.tokens for r in a] == [r.tokens for r in b]


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second CUDA device")
def test_a_model_on_the_second_device_is_captured_there():
    """The current device stays cuda:0; streams, capture and replay must follow the model."""
    model = random_model().to("cuda:1")
    reqs = mixed_workload(8)
    with full_precision():
        eager, _ = run_continuous(model, reqs, 3, max_len=128, **F32)
        graph, _ = run_continuous(model, reqs, 3, max_len=128, cuda_graph=True, **F32)
    assert torch.cuda.current_device() == 0
    assert [r.tokens for r in graph] == [r.tokens for r in eager]
