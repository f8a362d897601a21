"""CUDA-graph decoder: equal to eager and solo on CUDA; a clear refusal elsewhere."""

from __future__ import annotations

import pytest
import torch

from tinyllm.engine import ContinuousEngine, run_continuous
from tests.helpers import mixed_workload, random_model, solo_outputs

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on machines without CUDA")
def test_graphs_without_cuda_raise_a_clear_error():
    with pytest.raises(ValueError, match="cuda_graph needs a CUDA device"):
        ContinuousEngine(random_model(), 2, cuda_graph=True)


def test_graphs_with_paged_kv_are_refused():
    with pytest.raises(ValueError, match="kv='slots' only"):
        ContinuousEngine(random_model(), 2, kv="paged", cuda_graph=True)


@cuda
def test_graph_decode_equals_eager_and_solo():
    model = random_model().cuda()
    reqs = mixed_workload(24)
    solo = solo_outputs(model, reqs)
    eager, _ = run_continuous(model, reqs, 5)
    graph, _ = run_continuous(model, reqs, 5, cuda_graph=True)
    assert [r.tokens for r in graph] == [r.tokens for r in eager]
    assert sum(r.tokens == s for r, s in zip(graph, solo)) >= 22      # bf16 autocast: rare near-ties may flip


@cuda
def test_decoder_is_reusable_across_engines():
    from tinyllm.kv.cuda_graph import SlotGraphDecoder
    from tinyllm.kv.dense import SlotKVCache
    model = random_model().cuda()
    cfg = model.cfg
    slots = SlotKVCache(cfg.n_layers, 3, cfg.n_kv_heads, cfg.head_dim, 128, torch.bfloat16, "cuda")
    dec = SlotGraphDecoder(model, slots)
    reqs = mixed_workload(6)
    a, _ = run_continuous(model, reqs, 3, max_len=128, cuda_graph=dec)
    b, _ = run_continuous(model, reqs, 3, max_len=128, cuda_graph=dec)
    assert [r.tokens for r in a] == [r.tokens for r in b]
