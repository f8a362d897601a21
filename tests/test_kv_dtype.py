"""A bfloat16 KV cache (``kv_cache_dtype="bfloat16"``, vLLM's option name): half the memory per
token, so a KV budget buys twice the tokens, and half the bytes attention reads. Checked: the C
kernels store exactly what PyTorch's ``.to(torch.bfloat16)`` stores and attend what PyTorch
attends on the widened pool; every path (static, slots, paged, chunked) gives each request
what ``generate`` gives it alone with the same setting (on these short runs: rounding can turn
the float noise between PyTorch's attention and the kernel into a bfloat16 step, so long runs
of different paths may part), and the token-budget engine gives a request the same tokens alone
or batched however long it runs, at 64+ sequences and under preemption; the budget arithmetic;
the refusals; and the snapshot, recording and metrics saying which it is."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import check_invariants, chunked_engine, mixed_workload, random_model, with_early_eos
from tinyllm import native
from tinyllm.engine import ContinuousEngine, Request, kv_bytes_per_token, run_continuous, run_static
from tinyllm.engine.build import MIB
from tinyllm.engine.solo import generate
from tinyllm.kv.ragged import RaggedAttention
from tinyllm.observe.recording import blank_snapshot, make_header
from tinyllm.race.spec import LaneSpecError, parse_lane

needs_kernels = pytest.mark.skipif(native.library() is None, reason="no C compiler: the kernels are not built")
BF16 = "bfloat16"


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


@needs_kernels
def test_the_kv_store_rounds_as_pytorch_does_bit_for_bit():
    """Ties to even, signed zeros, subnormals, infinities, NaN and values past bfloat16's largest
    finite (rounding to inf) land on the same 16 bits as ``.to(torch.bfloat16)``."""
    torch.manual_seed(0)
    special = torch.tensor(
        [
            0.0,
            -0.0,
            1e-40,
            -1e-40,
            1e-45,
            float("inf"),
            -float("inf"),
            float("nan"),
            3.3961e38,
            -3.3961e38,
            1.0 + 2**-8,
            1.0 + 3 * 2**-8,
            1.0 + 2**-8 + 2**-20,
        ]
    )
    x = torch.cat([special, torch.randn(4000) * torch.logspace(-30, 30, 4000)])
    x = x[: x.numel() // 8 * 8].view(-1, 2, 4)  # (tokens, Hkv, D)
    k, v = x, -x
    write = torch.randperm(x.size(0) + 7)[: x.size(0)]
    kp = torch.zeros(x.size(0) + 7, 2, 4, dtype=torch.bfloat16)
    vp = torch.zeros_like(kp)
    assert native.kv_store(k, v, write, kp, vp)
    ref_k, ref_v = torch.zeros_like(kp), torch.zeros_like(vp)
    ref_k[write], ref_v[write] = k.to(torch.bfloat16), v.to(torch.bfloat16)
    nan = ref_k.isnan()  # (PyTorch's NaN bits depend on where it lies)
    assert nan.sum() == 1 and torch.equal(nan, kp.isnan()) and torch.equal(ref_v.isnan(), vp.isnan())
    assert torch.equal(bits(kp)[~nan], bits(ref_k)[~nan]) and torch.equal(bits(vp)[~nan], bits(ref_v)[~nan])


@needs_kernels
@pytest.mark.parametrize("D", [64, 16, 12])  # unrolled, vector, and scalar loops
def test_attention_over_a_bfloat16_pool_matches_pytorch_on_the_widened_pool(D):
    torch.manual_seed(1)
    bs, H, Hkv, n_blocks = 4, 4, 2, 12
    kp = (torch.randn(n_blocks * bs, Hkv, D) * 2).to(torch.bfloat16)
    vp = torch.randn(n_blocks * bs, Hkv, D).to(torch.bfloat16)
    tables = torch.tensor([[3, 1, 0, 2, 11], [5, 4, 7, 6, 10], [9, 9, 9, 9, 9]])
    lens = torch.tensor([17, 20, 3])
    q = torch.randn(H, 3, D)
    out = native.decode_attention(q, kp, vp, tables, lens, bs)
    for r in range(3):
        idx = torch.cat([torch.arange(b * bs, (b + 1) * bs) for b in tables[r].tolist()])[: int(lens[r])]
        keys = kp[idx].float().repeat_interleave(H // Hkv, 1).transpose(0, 1)  # (H, L, D)
        vals = vp[idx].float().repeat_interleave(H // Hkv, 1).transpose(0, 1)
        ref = torch.softmax(q[:, r : r + 1] @ keys.transpose(1, 2) * D**-0.5, -1) @ vals
        torch.testing.assert_close(out[:, r], ref[:, 0], atol=2e-6, rtol=1e-5)


@needs_kernels
def test_a_mixed_step_on_the_kernels_matches_pytorch_on_a_bfloat16_pool(model, monkeypatch):
    """The same ragged step (decodes and a prefill chunk) on the C layers and on PyTorch's path
    (every kernel off), from the same bfloat16 pool: the same K/V stored, logits equal to float
    noise."""

    def step(native_on: bool):
        monkeypatch.setattr(native, "ENABLED", native_on)
        eng = chunked_engine(model, 4, 96, block_size=8, budget=40, kv_cache_dtype=BF16)
        for i in range(3):  # 30-token prompts, 40 tokens a step
            eng.add_request(Request([(7 * i + 3 * j) % model.cfg.vocab_size for j in range(30)], 20))
        eng.step()
        eng.step()
        items = [(s.slot, s.computed, 1 if s.prefilled else min(8, s.remaining())) for s in eng._running]
        assert {n for _, _, n in items} - {1}, "a prefill chunk in the step"
        for slot, start, n in items:
            assert eng.slots.try_grow(slot, start + n)
        attn = RaggedAttention(eng.slots, sorted(items, key=lambda it: it[2] != 1))
        assert (attn.native_attention() is not None) == native_on
        toks = torch.arange(attn.total)[None] % model.cfg.vocab_size
        with torch.no_grad():
            logits, _ = model(toks, cache=attn)
        return logits, eng.slots.k.clone()

    on_logits, on_k = step(True)
    off_logits, off_k = step(False)
    monkeypatch.setattr(native, "ENABLED", True)
    assert on_k.dtype == torch.bfloat16
    torch.testing.assert_close(on_logits, off_logits, atol=1e-4, rtol=1e-4)
    assert (bits(on_k) != bits(off_k)).float().mean() < 0.01  # the same rounding, up to K noise


@pytest.fixture(scope="module")
def workload(model):
    return with_early_eos(model, mixed_workload(20, seed=7)), None


@pytest.fixture(scope="module")
def solo_bf16(model, workload):
    reqs, _ = workload
    return [generate(model, r.prompt, r.max_new_tokens, eos_id=r.eos_id, kv_cache_dtype=BF16) for r in reqs]


@pytest.mark.parametrize("kind", ["slots", "paged", "chunked", "chunked-tiny-pool"])
def test_every_continuous_path_equals_solo_with_a_bfloat16_cache(model, workload, solo_bf16, kind):
    reqs, _ = workload
    kw = dict(kv="slots") if kind == "slots" else dict(kv="paged", block_size=4)
    if kind.startswith("chunked"):
        kw.update(chunked_prefill=True, max_batched_tokens=24)
    if kind == "chunked-tiny-pool":
        kw.update(kv_blocks=40)  # preemption mid-prefill and mid-decode
    eng = ContinuousEngine(model, 6, 128, kv_cache_dtype=BF16, **kw)
    assert eng.slots.k.dtype == torch.bfloat16
    rids = [eng.add_request(r) for r in reqs]
    while eng.has_work():
        eng.step()
        check_invariants(eng)
    assert [eng.results.pop(r).tokens for r in rids] == solo_bf16
    if kind == "chunked-tiny-pool":
        assert eng.stats.preemptions > 0
    assert eng.slots.allocated_tokens() == 0


def test_static_batching_equals_solo_with_a_bfloat16_cache(model, workload, solo_bf16):
    reqs, _ = workload
    plain = [Request(r.prompt, r.max_new_tokens) for r in reqs]
    res, _ = run_static(model, plain, 5, kv_cache_dtype=BF16)
    assert [r.tokens for r in res] == [generate(model, r.prompt, r.max_new_tokens, kv_cache_dtype=BF16) for r in plain]


def test_bfloat16_rounding_is_really_applied(model, workload):
    """The reference itself changes with the setting: somewhere along these outputs the rounded
    K/V picks another token than float32's (else every equality above would hold trivially)."""
    reqs, _ = workload
    fp32 = [generate(model, r.prompt, 40) for r in reqs[:10]]
    bf16 = [generate(model, r.prompt, 40, kv_cache_dtype=BF16) for r in reqs[:10]]
    assert fp32 != bf16


def test_64_plus_sequences_on_what_a_bfloat16_budget_buys(model):
    """A budget buys twice the tokens at bfloat16: 96 requests on the pool a float32 budget of
    half the size would give, all running at once, each equal to solo."""
    reqs = mixed_workload(96, seed=11, max_prompt=40, max_new=24, eos_ids=(None,))
    fp32_bpt = kv_bytes_per_token(model, torch.device("cpu"))
    assert kv_bytes_per_token(model, torch.device("cpu"), BF16) * 2 == fp32_bpt
    mib = 96 * 64 * fp32_bpt / 2 / MIB  # 96 x 64 tokens at bfloat16
    pool = dict(max_len=64, kv="paged", block_size=8, kv_memory_mib=mib, max_num_seqs=96)
    bf16 = dict(pool, chunked_prefill=True, max_batched_tokens=4096, kv_cache_dtype=BF16)
    eng32, eng16 = ContinuousEngine(model, **pool), ContinuousEngine(model, **bf16)
    assert eng16.slots.n_blocks == 2 * eng32.slots.n_blocks == 96 * 64 // 8
    res, stats = run_continuous(model, reqs, **bf16)
    assert stats["peak_active"] == 96 and stats["preemptions"] == 0
    assert [r.tokens for r in res] == [generate(model, r.prompt, r.max_new_tokens, kv_cache_dtype=BF16) for r in reqs]


@needs_kernels
def test_the_token_budget_engine_gives_a_long_run_the_same_tokens_alone_or_batched():
    """The C kernels compute each token the same way whatever shares its step, so the bfloat16
    rounding of its K/V is the same too: 12 requests of up to 120 tokens, batched on a small pool
    (preempted and recomputed) and each alone."""
    model = random_model(seed=5, max_seq_len=192)
    reqs = mixed_workload(12, seed=5, max_prompt=50, max_new=120, eos_ids=(None,))
    kw = dict(max_len=192, kv="paged", block_size=8, chunked_prefill=True, max_batched_tokens=64, kv_cache_dtype=BF16)
    res, stats = run_continuous(model, reqs, n_slots=12, kv_blocks=60, **kw)
    assert stats["preemptions"] > 0
    assert [r.tokens for r in res] == [run_continuous(model, [r], n_slots=1, **kw)[0][0].tokens for r in reqs]


@pytest.mark.parametrize("bad", ["fp8", "float16", "bf16", "", None, torch.bfloat16, ["bfloat16"]])
def test_an_unknown_kv_cache_dtype_is_refused_naming_the_choices(model, bad):
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of 'auto', 'float32', 'bfloat16'"):
        ContinuousEngine(model, 2, 64, kv_cache_dtype=bad)
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        generate(model, [1, 2], 2, kv_cache_dtype=bad)


def test_the_command_line_takes_the_short_names_too():
    from tinyllm.args import kv_dtype_arg

    assert [kv_dtype_arg(s) for s in ("auto", "float32", "bfloat16", "fp32", "bf16")] == [
        "auto",
        "float32",
        BF16,
        "float32",
        BF16,
    ]


def test_a_lane_takes_its_own_kv_dtype_and_refuses_a_bad_one():
    assert parse_lane("fcfs kv_dtype=bfloat16").kv_dtype == BF16
    assert parse_lane("static kv_dtype=float32").kv_dtype == "float32"
    assert parse_lane("fcfs kv_dtype=bf16").kv_dtype == BF16 and parse_lane("fcfs kv_dtype=fp32").kv_dtype == "float32"
    assert "KV bfloat16" in parse_lane("fcfs kv_dtype=bfloat16").describe()
    with pytest.raises(
        LaneSpecError, match=r"kv_dtype must be one of auto, float32, bfloat16 \(fp32, bf16\), got 'fp8'"
    ):
        parse_lane("fcfs kv_dtype=fp8")


def test_the_snapshot_and_a_recording_say_which_dtype_the_cache_holds(model):
    for dtype, name in (("auto", "float32"), ("float32", "float32"), (BF16, BF16)):
        eng = ContinuousEngine(model, 2, 64, kv="paged", chunked_prefill=True, kv_cache_dtype=dtype)
        snap = eng.snapshot()
        assert snap.kv.dtype == name
        header = make_header(snap, "m", "t", {})
        assert blank_snapshot(header).kv.dtype == name
        assert eng.stats.kv_bytes_per_token == kv_bytes_per_token(model, torch.device("cpu"), dtype)
    old = make_header(snap, "m", "t", {})
    del old["engine"]["kv"]["dtype"]  # a recording from before the field
    assert blank_snapshot(old).kv.dtype == ""
