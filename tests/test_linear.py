"""The model's Linear (model/linear.py): on CPU without autograd it multiplies from a packed copy
of its weight (the C kernel's panels, or oneDNN's layout without a compiler). Checked, on both:
the same results as F.linear at any row count and shape; a weight changed in place, replaced, or
loaded from a state dict is repacked (never a stale copy); autograd and autocast take F.linear;
the state dict holds nothing new; a residual passed as ``add`` is added."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tinyllm import native
from tinyllm.model import linear
from tinyllm.model.linear import Linear

BACKENDS = [
    pytest.param("c", marks=pytest.mark.skipif(native.library() is None, reason="no C kernels here")),
    pytest.param("onednn", marks=pytest.mark.skipif(not linear._ONEDNN, reason="no oneDNN in this torch")),
]


@pytest.fixture(params=BACKENDS, autouse=True)
def backend(request, monkeypatch) -> str:
    """Each test on the C kernel and on oneDNN (what runs where no compiler builds the kernels)."""
    if request.param == "onednn":
        monkeypatch.setattr(native, "pack_linear", lambda w: None)
    return request.param


def layer(d_in: int = 48, d_out: int = 80, seed: int = 0) -> Linear:
    torch.manual_seed(seed)
    m = Linear(d_in, d_out, bias=False)
    torch.nn.init.normal_(m.weight, std=0.3)
    return m


@pytest.mark.parametrize("shape", [(1, 48), (7, 48), (64, 48), (300, 48), (1, 5, 48), (3, 9, 48)])
def test_packed_path_equals_f_linear_at_any_shape(shape, backend):
    m = layer()
    x = torch.randn(*shape)
    with torch.no_grad():
        out = m(x)
        res = torch.randn(out.shape)
        with_residual = m(x, add=res)
    assert m._packed is not None and m._packed_by == backend  # the packed path ran, this one
    torch.testing.assert_close(out, F.linear(x, m.weight), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(with_residual, res + F.linear(x, m.weight), rtol=1e-5, atol=1e-5)


def test_a_non_contiguous_input_is_multiplied_as_its_values():
    m = layer()
    x = torch.randn(48, 10).t()  # (10, 48), not contiguous
    with torch.no_grad():
        torch.testing.assert_close(m(x), F.linear(x, m.weight), rtol=1e-5, atol=1e-5)


def test_a_weight_changed_in_place_replaced_or_loaded_is_repacked():
    m = layer()
    x = torch.randn(4, 48)
    with torch.no_grad():
        m(x)
        m.weight.mul_(2.0)  # an optimizer step, init, copy_
        torch.testing.assert_close(m(x), F.linear(x, m.weight), rtol=1e-5, atol=1e-5)
        m.weight = torch.nn.Parameter(torch.randn(80, 48))  # a new tensor (tying, assign=True loads)
        torch.testing.assert_close(m(x), F.linear(x, m.weight), rtol=1e-5, atol=1e-5)
        m.load_state_dict(layer(seed=5).state_dict())
        torch.testing.assert_close(m(x), F.linear(x, layer(seed=5).weight), rtol=1e-5, atol=1e-5)


def test_a_weight_moved_or_cast_through_data_is_repacked_even_at_a_reused_address():
    """``.half().float()`` (train.py, before scoring what ships) and ``.to()`` assign ``weight.data``:
    same tensor, same version; only the storage changes, and a freed address can come back."""
    x = torch.randn(3, 512)
    for seed in range(6):
        m = layer(512, 4096, seed=seed)
        with torch.no_grad():
            m(x)  # packed from the fp32 weights
        m.half().float()  # the freed fp32 storage may be reused
        with torch.no_grad():  # (a stale pack is off by ~1e-3: fp16 rounding)
            torch.testing.assert_close(m(x), F.linear(x, m.weight), rtol=1e-4, atol=1e-4)


def test_inference_mode_weights_take_f_linear():
    with torch.inference_mode():
        m = layer()
        x = torch.randn(4, 48)
        torch.testing.assert_close(m(x), F.linear(x, m.weight))
    assert m._packed is None


def test_autograd_and_autocast_take_f_linear_and_the_state_dict_is_unchanged():
    m = layer()
    x = torch.randn(4, 48)
    out = m(x)  # autograd on: trains as nn.Linear
    out.sum().backward()
    assert m.weight.grad is not None and m._packed is None
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert m(x).dtype == torch.bfloat16 and m._packed is None
    with torch.no_grad():
        m(x)
    assert set(m.state_dict()) == {"weight"}


def test_a_replaced_weight_of_another_width_gives_its_own_width():
    """out_features is only what the layer was built with: the packed weight's rows decide."""
    m = layer()
    x = torch.randn(3, 48)
    with torch.no_grad():
        for rows in (90, 95, 81):  # 90 and 95 need the same 6 panels as 96
            m.weight = torch.nn.Parameter(torch.randn(rows, 48))
            torch.testing.assert_close(m(x), F.linear(x, m.weight), rtol=1e-5, atol=1e-5)
