"""The decoder layers in one C call each (tinyllm/model/c_layers.py, csrc/decoder_layer.c): the same
bits as the model's layers op by op, taken only where every op would run on the kernels, the
weights it keeps rebuilt when the model's change, and every range it trusts checked."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from tests.test_ragged_attention import filled_pool
from tinyllm import native
from tinyllm.kv.ragged import RaggedAttention
from tinyllm.model.c_layers import CLayers

pytestmark = pytest.mark.skipif(native.library() is None, reason=f"no native kernel here: {native.why_not}")

LENS = [1, 7, 16, 17, 40, 63, 30]


def model_with_random_norms(head_dim: int = 16, seed: int = 0):
    """A random model whose every RMSNorm weight differs (random_model's are all ones, so a layer
    reading one norm's weight for the other's would pass unseen), ``head_dim`` 16 or 64 (the
    attention kernel's generic path, and its unrolled D=64 one)."""
    from tests.helpers import random_model

    model = random_model(seed=seed, d_model=4 * head_dim)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


@pytest.fixture(scope="module")
def normed():
    return {16: model_with_random_norms(16), 64: model_with_random_norms(64)}


def ragged_forward(model, whole_layers: bool, items=None, monkeypatch=None, seed: int = 9):
    """The model over one ragged batch on a pool of random K/V: (logits, K pool, V pool, whether
    the layers ran in C). ``items`` default: six decodes at many lengths and a 10-token chunk."""
    cfg = model.cfg
    pool = filled_pool(LENS, 4, hkv=cfg.n_kv_heads, d=cfg.head_dim, seed=seed, layers=cfg.n_layers)
    items = items or [(slot, n - 1, 1) for slot, n in enumerate(LENS[:-1])] + [(6, 20, 10)]
    n_tokens = sum(n for _, _, n in items)
    tokens = torch.tensor([[random.Random(i).randrange(cfg.vocab_size) for i in range(n_tokens)]])
    plans = []
    real = CLayers.plan.__func__

    def plan(cls, *a):
        p = real(cls, *a) if whole_layers else None
        plans.append(p)
        return p

    mp = monkeypatch or pytest.MonkeyPatch()
    mp.setattr(CLayers, "plan", classmethod(plan))
    try:
        with torch.no_grad():
            logits, _ = model(tokens, cache=RaggedAttention(pool, items))
    finally:
        if monkeypatch is None:
            mp.undo()
    return logits, pool.k, pool.v, plans[0] is not None


@pytest.mark.parametrize("head_dim", [16, 64])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", ["decodes", "decodes+chunk", "chunk"])
def test_layers_in_c_give_the_same_bits_as_op_by_op(normed, head_dim, threads, batch):
    """Logits and the K/V written to the pool, bit for bit, on one and two threads; decodes alone,
    with a prefill chunk (several rows reading one table), a chunk alone; head_dim 16 and 64."""
    model = normed[head_dim]
    torch.set_num_threads(threads)
    items = {
        "decodes": [(slot, n - 1, 1) for slot, n in enumerate(LENS[:-1])],
        "decodes+chunk": None,
        "chunk": [(6, 0, 25)],
    }[batch]
    c_logits, c_k, c_v, in_c = ragged_forward(model, True, items)
    py_logits, py_k, py_v, _ = ragged_forward(model, False, items)
    assert in_c
    assert torch.equal(c_logits, py_logits)
    assert torch.equal(c_k, py_k) and torch.equal(c_v, py_v)


@pytest.mark.parametrize("n_layers", [1, 2, 3])
def test_odd_and_even_layer_counts_give_the_same_bits(n_layers):
    """The layers take turns writing two buffers: the final norm's output ends in one or the other
    by the count's parity. The embedding's output is only read (a hook may hold it)."""
    from tests.helpers import random_model

    model = random_model(seed=n_layers, n_layers=n_layers)
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)  # a final norm that shows
    held = []
    model.embed_tokens.register_forward_hook(lambda m, args, out: held.append((out, out.clone())))
    c_logits, c_k, c_v, in_c = ragged_forward(model, True)
    py_logits, py_k, py_v, _ = ragged_forward(model, False)
    assert in_c and torch.equal(c_logits, py_logits)
    assert torch.equal(c_k, py_k) and torch.equal(c_v, py_v)
    assert torch.equal(*held[0])  # the embedding's output as it was


def test_the_final_norm_runs_in_c_only_as_the_model_has_it(monkeypatch):
    """The final RMSNorm is part of the one C call: a hook on it, or another class in its place,
    sends the forward op by op; a changed norm weight or eps shows in the logits."""
    from tests.helpers import random_model
    from tinyllm.model.transformer import RMSNorm

    model = random_model(seed=5)
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
    base, *_, in_c = ragged_forward(model, True)
    assert in_c
    handle = model.norm.register_forward_hook(lambda *a: None)
    *_, in_c = ragged_forward(model, True)
    assert not in_c
    handle.remove()

    class Scaled(RMSNorm):
        def forward(self, x):
            return 2 * super().forward(x)

    scaled = Scaled(model.cfg.d_model, model.norm.eps)
    scaled.load_state_dict(model.norm.state_dict())
    plain, model.norm = model.norm, scaled
    logits, *_, in_c = ragged_forward(model, True)
    assert not in_c and not torch.equal(logits, base)
    model.norm = plain
    with torch.no_grad():
        model.norm.weight.mul_(0.5)
    model.norm.eps = 1e-2
    after, *_, in_c = ragged_forward(model, True)
    want, *_ = ragged_forward(model, False)
    assert in_c and torch.equal(after, want) and not torch.equal(after, base)


def test_changed_weights_are_picked_up():
    """The layer weights kept between forwards are rebuilt when a weight is updated in place, or
    replaced by another tensor: the logits follow the model's weights as op by op."""
    from tests.helpers import random_model

    model = random_model()  # its own: this test changes the weights
    before, *_ = ragged_forward(model, True)
    with torch.no_grad():
        model.layers[0].mlp.down_proj.weight.mul_(2.0)  # in place
    model.layers[1].input_layernorm.weight = nn.Parameter(torch.full((model.cfg.d_model,), 0.5))
    model.layers[1].self_attn.o_proj.weight = nn.Parameter(model.layers[1].self_attn.o_proj.weight * -1)
    after, *_, in_c = ragged_forward(model, True)
    want, *_ = ragged_forward(model, False)
    assert in_c and torch.equal(after, want) and not torch.equal(after, before)


def test_taken_only_where_every_op_runs_on_the_kernels(monkeypatch):
    """Grad mode, a forward hook on a block, a linear layer repacked for another path, a cache
    that is not the paged pool's ragged batch, float64: each answers None (the model then runs op
    by op)."""
    from tests.helpers import random_model

    model = random_model()  # its own: this test repacks a layer
    cfg = model.cfg
    pool = filled_pool(LENS, 4, hkv=cfg.n_kv_heads, d=cfg.head_dim, seed=1, layers=cfg.n_layers)
    attn = RaggedAttention(pool, [(0, 0, 1)])
    x = torch.randn(1, 1, cfg.d_model)
    from tinyllm.model.transformer import Rotary

    rotary = Rotary(attn.begin(1, 1), model.rope_cos, model.rope_sin)
    with torch.no_grad():
        assert CLayers.plan(model.layers, model.norm, x, rotary, attn) is not None
        assert CLayers.plan(model.layers, model.norm, x, rotary, object()) is None  # no paged pool
        assert CLayers.plan(model.layers, model.norm, x.double(), rotary, attn) is None
        handle = model.layers[1].register_forward_hook(lambda *a: None)
        assert CLayers.plan(model.layers, model.norm, x, rotary, attn) is None
        handle.remove()
        monkeypatch.setattr(native, "pack_linear", lambda w: None)  # as without a compiler: oneDNN packs
        model.layers[0].mlp.gate_up_proj.weight.mul_(1.0)  # changed: repacked at the next plan
        assert CLayers.plan(model.layers, model.norm, x, rotary, attn) is None
        assert model.layers[0].mlp.gate_up_proj._packed_by != "c"
    assert CLayers.plan(model.layers, model.norm, x, rotary, attn) is None  # grad mode on


def test_ranges_the_c_trusts_are_checked_first(model):
    """A block id past the pool in a table a step reads, an item past the tables, or a position
    past the rotary tables: a ValueError before any layer runs, never a read out of bounds."""
    cfg = model.cfg
    pool = filled_pool(LENS, 4, hkv=cfg.n_kv_heads, d=cfg.head_dim, seed=2, layers=cfg.n_layers)
    attn = RaggedAttention(pool, [(0, 0, 1), (1, 6, 1)])
    tables, lens, row_table = attn._native  # (the pool's own tables)
    assert tables.data_ptr() == pool.table_rows.data_ptr() and row_table.tolist() == [0, 1]
    assert lens.tolist() == [1, 7] and attn._pos.tolist() == [0, 6]
    assert attn._write.tolist() == [pool.tables[0][0] * 4, pool.tables[1][1] * 4 + 2]
    kept = int(tables[1, 0])
    tables[1, 0] = pool.n_blocks  # the scratch block: no block of the pool's
    with pytest.raises(ValueError, match=r"ragged item 1 \(slot 1, positions 6..6\): its block table does not hold"):
        RaggedAttention(pool, [(0, 0, 1), (1, 6, 1)])
    tables[1, 0] = kept
    past = len(pool.tables[0]) * pool.block_size  # the first position slot 0 has no block for
    with pytest.raises(ValueError, match="its block table does not hold"):
        RaggedAttention(pool, [(0, past, 1)])
    width = pool.table_width * pool.block_size
    for item in [(len(pool.tables), 0, 1), (0, width, 1), (0, width - 1, 2), (0, -1, 1), (0, 0, 0)]:
        with pytest.raises(ValueError, match="is outside the block tables"):
            RaggedAttention(pool, [item])
    attn = RaggedAttention(pool, [(0, 0, 1)])
    attn._pos[0] = model.rope_cos.size(0)
    with torch.no_grad(), pytest.raises(ValueError, match="rotary positions must be in"):
        model(torch.tensor([[1]]), cache=attn)


def changed_model(change: str):
    """A model with one thing about its layers changed after a first forward on the C path."""
    from tests.helpers import random_model

    model = random_model(seed=3)
    ragged_forward(model, True)  # the layers' C weights kept
    block = model.layers[1]
    if change == "one norm's eps":  # the layer takes one eps: op by op
        block.post_attention_layernorm.eps = 0.5
    elif change == "every eps":
        for b in model.layers:
            b.input_layernorm.eps = b.post_attention_layernorm.eps = 0.5
    elif change == "bias":
        block.self_attn.o_proj.bias = nn.Parameter(torch.ones(model.cfg.d_model))
    elif change == "replaced mlp":
        from tinyllm.model.transformer import MLP

        class GeluMLP(MLP):  # the same parts, computed otherwise
            def forward(self, x, residual):
                return residual + self.down_proj(
                    torch.nn.functional.gelu(self.gate_up_proj(x)[..., : self.down_proj.in_features])
                )

        mlp = GeluMLP(model.cfg)
        mlp.load_state_dict(block.mlp.state_dict())
        block.mlp = mlp
    elif change == "narrow norms":
        for n in (block.input_layernorm, block.post_attention_layernorm):
            n.weight = nn.Parameter(torch.ones(model.cfg.d_model // 2))
    elif change == "layer index":
        block.self_attn.layer_idx = 0
    return model


@pytest.mark.parametrize("change", ["every eps", "one norm's eps", "bias", "replaced mlp", "layer index"])
def test_a_changed_layer_is_computed_as_op_by_op(change):
    """After the C weights were kept: the norms' eps changed (all, or one), a bias added, the MLP
    replaced by a subclass with the same parts, a layer pointed at another pool layer: the logits
    are op by op's, whether the change still runs in C (every eps) or sends the forward op by op."""
    model = changed_model(change)
    got, *_, in_c = ragged_forward(model, True)
    want, *_ = ragged_forward(model, False)
    assert torch.equal(got, want)
    assert in_c == (change == "every eps")


def test_norms_of_another_width_are_refused_not_read_past():
    """Norm weights narrower than the activations: the plan declines and op by op raises PyTorch's
    size error (the C would have read past the weights)."""
    model = changed_model("narrow norms")
    with pytest.raises(RuntimeError):
        ragged_forward(model, True)


@pytest.mark.parametrize("where", ["block pre-hook", "sub-module hook", "global hook", "autocast"])
def test_hooks_and_autocast_send_the_forward_op_by_op(where):
    """A hook wants to see its module run (on the block, on a part of it, or on every module),
    autocast wants its dtype: the C path declines, and the hooks fire."""
    from tests.helpers import random_model

    model = random_model(seed=4)
    fired = []
    if where == "block pre-hook":
        handle = model.layers[0].register_forward_pre_hook(lambda *a: fired.append(1))
    elif where == "sub-module hook":
        handle = model.layers[1].mlp.down_proj.register_forward_hook(lambda *a: fired.append(1))
    elif where == "global hook":
        handle = nn.modules.module.register_module_forward_hook(lambda *a: fired.append(1))
    try:
        if where == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                *_, in_c = ragged_forward(model, True)
        else:
            *_, in_c = ragged_forward(model, True)
    finally:
        if where != "autocast":
            handle.remove()
    assert not in_c
    assert where == "autocast" or fired


@pytest.mark.parametrize("change", ["one norm's eps", "hook", "layer index", "weight in place", "parametrization"])
def test_layers_kept_between_forwards_see_a_change(change):
    """Over the same pool the layers' C array is kept from one forward to the next (``_Frame``);
    a change between two forwards (a norm's eps, a hook, a layer's index, a weight changed in
    place, a parametrization: its module's class swapped, its weight no longer a parameter) is
    seen at the next one: its logits are op by op's, in C again only for the weight (repacked, a
    new array)."""
    from tests.helpers import random_model

    model = random_model(seed=3)
    cfg = model.cfg
    pool = filled_pool(LENS, 4, hkv=cfg.n_kv_heads, d=cfg.head_dim, seed=1, layers=cfg.n_layers)
    items = [(slot, n - 1, 1) for slot, n in enumerate(LENS[:-1])]
    tokens = torch.tensor([[5 + i for i in range(len(items))]])
    real = CLayers.plan.__func__

    def forward(in_c: bool = True):
        plans = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(
                CLayers, "plan", classmethod(lambda cls, *a: plans.append(real(cls, *a) if in_c else None) or plans[-1])
            )
            with torch.no_grad():
                logits, _ = model(tokens, cache=RaggedAttention(pool, items))
        return logits, plans[0]

    _, first = forward()
    _, second = forward()
    assert first is not None and second is not None and second.weights is first.weights
    fired = []
    block = model.layers[1]
    if change == "one norm's eps":
        block.post_attention_layernorm.eps = 0.5
    elif change == "hook":
        block.mlp.register_forward_hook(lambda *a: fired.append(1))
    elif change == "layer index":
        block.self_attn.layer_idx = 0
    elif change == "parametrization":
        torch.nn.utils.parametrize.register_parametrization(block.mlp.down_proj, "weight", nn.Identity())
    else:
        with torch.no_grad():
            block.mlp.down_proj.weight.mul_(1.5)
    got, plan = forward()
    want, _ = forward(in_c=False)
    assert torch.equal(got, want)
    assert (plan is not None) == (change == "weight in place")
    assert plan is None or plan.weights is not first.weights
    assert fired == ([1, 1] if change == "hook" else [])
