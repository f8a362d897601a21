"""The C kernels (tinyllm/csrc, built and loaded by tinyllm/native/). Decode attention: each
row checked against plain attention over its own K/V read through its block table, for every
head-size code path (the unrolled 64 and 128, the vector and scalar fallbacks), GQA groups,
block sizes, threads and query strides; its fallbacks (turned off, no compiler, a failing
compiler); and end to end in the engine: greedy == solo, and the same tokens as the PyTorch path.
Where this machine has no C compiler the kernel tests skip, saying so; the fallback tests run."""

from __future__ import annotations

import ctypes
import random
import shutil
from pathlib import Path

import pytest
import torch

from tests.helpers import check_ragged_columns, mixed_workload, solo_outputs, with_early_eos
from tinyllm import native
from tinyllm.engine import run_continuous

needs_kernel = pytest.mark.skipif(native.library() is None, reason=f"no native kernel here: {native.why_not}")


def scattered_tables(lens: list[int], bs: int, seed: int) -> tuple[torch.Tensor, int]:
    """Block tables (rows, widest) whose blocks are a shuffled range: a row's blocks are not
    adjacent, and the entries past a row's blocks name the last block, which ``pool`` fills with
    NaN (a row that read one would come out NaN). Returns the tables and the block count, pad
    block included."""
    need = [-(-n // bs) for n in lens]
    ids = list(range(sum(need)))
    random.Random(seed).shuffle(ids)
    width = max(need) + 2
    tables = torch.full((len(lens), width), sum(need), dtype=torch.long)  # the NaN pad block
    at = 0
    for r, nb in enumerate(need):
        tables[r, :nb] = torch.tensor(ids[at : at + nb])
        at += nb
    return tables, sum(need) + 1


def pool(n_blocks: int, bs: int, hkv: int, d: int) -> torch.Tensor:
    """Random K or V for n_blocks blocks, the last (the tables' padding) NaN; and tokens past a
    row's length inside its last block are random: read, they would change the result."""
    t = torch.randn(n_blocks * bs, hkv, d)
    t[(n_blocks - 1) * bs :] = float("nan")
    return t


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tables: torch.Tensor, lens: list[int], bs: int
) -> torch.Tensor:
    """(H, rows, D): each row's heads over its own positions, in float64."""
    H, rows, D = q.shape
    g = H // k.size(1)
    out = torch.empty(H, rows, D, dtype=torch.float64)
    for r, L in enumerate(lens):
        idx = torch.tensor([int(tables[r, p // bs]) * bs + p % bs for p in range(L)])
        K, V = k[idx].double(), v[idx].double()  # (L, Hkv, D)
        for h in range(H):
            w = torch.softmax(K[:, h // g] @ q[h, r].double() * D**-0.5, dim=0)
            out[h, r] = w @ V[:, h // g]
    return out


@needs_kernel
@pytest.mark.parametrize("D", [64, 128, 32, 24, 20, 256])  # dot: unrolled 64/128, vectors (32), scalar (24, 20);
# values: in registers, in memory (24, 20; 256 on AVX2)
@pytest.mark.parametrize("heads", [(4, 2), (6, 2), (3, 3), (8, 1)])
@pytest.mark.parametrize("bs", [1, 4, 16])
def test_each_row_attends_exactly_its_own_positions(D, heads, bs):
    H, Hkv = heads
    lens = [1, 2, 15, 16, 17, 33, 100, 5]
    tables, n_blocks = scattered_tables(lens, bs, seed=D + bs)
    torch.manual_seed(D * bs + H)
    k, v = pool(n_blocks, bs, Hkv, D), pool(n_blocks, bs, Hkv, D)
    q = torch.randn(H, len(lens), D)
    out = native.decode_attention(q, k, v, tables, torch.tensor(lens), bs)
    assert out.shape == (H, len(lens), D)
    torch.testing.assert_close(out.double(), reference(q, k, v, tables, lens, bs), rtol=2e-5, atol=2e-5)


@needs_kernel
@pytest.mark.parametrize("D", [64, 128, 32, 256])
@pytest.mark.parametrize("H", [8, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_same_bits_however_positions_and_heads_are_grouped(D, H, dtype):
    """The kernel sums keys eight positions at a time within a block (a transposed horizontal
    sum) and a group's query heads' values together, as many as the registers hold: each score
    and each output is still the same sum in the same order. So the same K/V in blocks of 16
    (eight at a time) and of 1 (one by one), and H query heads sharing one KV head against each
    head alone, give identical bits, for either pool element."""
    lens = [100, 37, 8, 1, 16, 23]
    torch.manual_seed(D + H)
    q = torch.randn(H, len(lens), D)
    dense_k, dense_v = torch.randn(len(lens), max(lens), 1, D), torch.randn(len(lens), max(lens), 1, D)
    outs = {}
    for bs in (16, 1):
        tables, n_blocks = scattered_tables(lens, bs, seed=bs)
        k, v = pool(n_blocks, bs, 1, D), pool(n_blocks, bs, 1, D)
        for r, L in enumerate(lens):  # the same K/V, laid out in bs-blocks
            for p in range(L):
                at = int(tables[r, p // bs]) * bs + p % bs
                k[at], v[at] = dense_k[r, p], dense_v[r, p]
        k, v = k.to(dtype), v.to(dtype)
        outs[bs] = native.decode_attention(q, k, v, tables, torch.tensor(lens), bs)
        alone = torch.cat(
            [native.decode_attention(q[h : h + 1], k, v, tables, torch.tensor(lens), bs) for h in range(H)]
        )
        assert torch.equal(outs[bs], alone)
    assert torch.equal(outs[16], outs[1])


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads_and_strided_queries_give_the_same_result(threads):
    """The model hands over q as a slice of its fused projection (strided); rows run on several
    threads: identical output either way."""
    torch.set_num_threads(threads)
    H, Hkv, D, bs = 4, 2, 64, 16
    lens = [random.Random(i).randint(1, 200) for i in range(37)]
    tables, n_blocks = scattered_tables(lens, bs, seed=5)
    torch.manual_seed(1)
    k, v = pool(n_blocks, bs, Hkv, D), pool(n_blocks, bs, Hkv, D)
    wide = torch.randn(len(lens), H + 3, D)  # (rows, heads + others, D)
    q = wide[:, 1 : H + 1].transpose(0, 1)  # (H, rows, D), strided
    out = native.decode_attention(q, k, v, tables, torch.tensor(lens), bs)
    torch.testing.assert_close(out.double(), reference(q, k, v, tables, lens, bs), rtol=2e-5, atol=2e-5)
    torch.set_num_threads(1)
    assert torch.equal(out, native.decode_attention(q.contiguous(), k, v, tables, torch.tensor(lens), bs))


@needs_kernel
def test_extreme_scores_stay_finite():
    """Scores thousands apart: the softmax's exponent is clamped (e^-87 ~ 0), never inf or NaN;
    the largest score takes all the weight."""
    H, Hkv, D, bs = 2, 1, 64, 4
    lens = [9]
    tables, n_blocks = scattered_tables(lens, bs, seed=0)
    k = torch.zeros(n_blocks * bs, Hkv, D)
    v = torch.randn(n_blocks * bs, Hkv, D)
    hot = int(tables[0, 1]) * bs + 2  # position 6
    k[hot] = 100.0
    q = torch.full((H, 1, D), 10.0)
    q[1] = -10.0  # head 1: position 6 scores lowest
    out = native.decode_attention(q, k, v, tables, torch.tensor(lens), bs)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0, 0], v[hot, 0])
    others = [int(tables[0, p // bs]) * bs + p % bs for p in range(9) if p != 6]
    torch.testing.assert_close(out[1, 0], v[others, 0].mean(0), rtol=1e-5, atol=1e-5)


@needs_kernel
def test_a_ragged_batch_of_decodes_and_chunks_runs_on_the_kernel():
    """In the engine's RaggedAttention: every token, decode or chunk, goes to the kernel in one
    call (no PyTorch plan is made), and every token sees exactly its own positions (a chunk's
    tokens causal from its start)."""
    from tests.test_ragged_attention import filled_pool
    from tests.test_ragged_attention import reference as one_row
    from tinyllm.kv.ragged import RaggedAttention

    lens = [30, 9, 41, 20, 1]
    pool = filled_pool(lens, 4, d=64, seed=3)
    H = 4
    items = [(0, 29, 1), (1, 8, 1), (4, 0, 1), (2, 41 - 12, 12), (3, 20 - 5, 5)]  # three decodes, two chunks
    attn = RaggedAttention(pool, items)
    T = sum(n for _, _, n in items)
    q = torch.randn(1, H, T, 64)
    out = attn.attend(0, q, pool.k[0, attn._write].transpose(0, 1)[None], pool.v[0, attn._write].transpose(0, 1)[None])
    assert attn._native is not None and attn._native[2].tolist() == [slot for slot, _, n in items for _ in range(n)]
    assert attn._decode is None and attn._chunks is None
    check_ragged_columns(out, q, pool, items, one_row)


@needs_kernel
def test_a_prompt_computes_the_same_bits_whatever_its_chunking(model):
    """On the kernels every token is computed on its own (its own row of every linear layer, norm
    and attention), so a 40-token prompt prefilled in one pass, or in chunks of 7 over six passes,
    leaves bit-identical K/V in the pool and gives the same logits for its last token."""
    from tinyllm.kv.paged import PagedKVCache
    from tinyllm.kv.ragged import RaggedAttention

    cfg, n = model.cfg, 40
    with torch.no_grad():  # the premise: this machine's matmul is per-row invariant
        x, lin = torch.randn(n, cfg.d_model), model.layers[0].self_attn.qkv_proj
        if not all(torch.equal(lin(x[s : s + 7]), lin(x)[s : s + 7]) for s in range(0, n, 7)):
            pytest.skip("this machine's matmul gives a row different bits in a different batch")
    prompt = [random.Random(i).randrange(cfg.vocab_size) for i in range(n)]
    results = []
    for chunk in (n, 7):
        pool = PagedKVCache(cfg.n_layers, 1, cfg.n_kv_heads, cfg.head_dim, 16, 4, max_len=64)
        pool.occupy(0, n)
        with torch.no_grad():
            for start in range(0, n, chunk):
                part = prompt[start : start + chunk]
                attn = RaggedAttention(pool, [(0, start, len(part))])
                logits, _ = model(torch.tensor([part]), cache=attn, logits_at=torch.tensor([len(part) - 1]))
        rows = [pool.tables[0][p // 4] * 4 + p % 4 for p in range(n)]
        results.append((pool.k[:, rows], pool.v[:, rows], logits))
    for one, chunked in zip(*results):
        assert torch.equal(one, chunked)


def test_turned_off_by_environment(monkeypatch):
    monkeypatch.setattr(native, "ENABLED", False)
    assert native.library() is None
    assert "TINYLLM_NATIVE=0" in native.why_not
    assert native.rms_norm(torch.randn(3, 8), torch.ones(8), 1e-5) is None


@pytest.mark.parametrize("cc, why", [(None, "no C compiler"), ("false", "build failed")])
def test_without_a_working_compiler_the_engine_stays_on_pytorch(monkeypatch, tmp_path, model, cc, why):
    """No compiler, or one that fails: library() says why once and returns None, and the engine
    runs its PyTorch attention, with the same tokens."""
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setenv("TINYLLM_CACHE", str(tmp_path))
    monkeypatch.setattr(native.build, "compiler", lambda: cc)
    assert native.library() is None
    assert why in native.why_not
    assert not list(tmp_path.rglob("*.so")) and not list(tmp_path.rglob("*.tmp*"))
    reqs = mixed_workload(6, seed=2)
    res, stats = run_continuous(model, reqs, 4, kv="paged", block_size=4, chunked_prefill=True, max_batched_tokens=32)
    assert [r.tokens for r in res] == solo_outputs(model, reqs)
    assert stats["kv_allocated_at_end"] == 0


@pytest.fixture
def one_kernel(monkeypatch, tmp_path) -> Path:
    """The build over one kernel's source (argmax.c and the headers), into a cache under
    tmp_path: these tests are about the build and its cache, not the kernels, and a build of
    every kernel takes seconds (the suite's own build, which every kernel test uses, is that)."""
    if native.build.compiler() is None:
        pytest.skip("no C compiler here")
    src = tmp_path / "csrc"
    src.mkdir()
    for name in ("argmax.c", "kernels.h", "simd.h"):
        shutil.copy(native.build.CSRC / name, src)
    monkeypatch.setattr(native.build, "CSRC", src)
    monkeypatch.setenv("TINYLLM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "kernels"


def argmax_of(lib_path: Path, x: torch.Tensor) -> torch.Tensor:
    """``x``'s row argmax by the built library's kernel, called as the engine calls it."""
    lib = ctypes.CDLL(str(lib_path))
    lib.argmax_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.argmax_rows.restype = None
    out = torch.empty(x.size(0), 1, dtype=torch.long)
    lib.argmax_rows(x.data_ptr(), x.stride(0), x.size(0), x.size(1), out.data_ptr())
    return out


def test_built_into_the_cache_once_and_reused(one_kernel, monkeypatch):
    cc = native.build.compiler()
    built = native.build.built_library(cc)
    assert built.parent == one_kernel and list(one_kernel.rglob("*.so")) == [built]
    left = sorted(p.name for p in one_kernel.iterdir())
    assert left == [native.build.LOCK_NAME, built.name, built.name + ".json"]  # no temporary left
    x = torch.randn(5, 300)
    assert torch.equal(argmax_of(built, x), x.argmax(dim=-1, keepdim=True))
    monkeypatch.setattr(native.build, "_compile", lambda *a: pytest.fail("built again"))
    assert native.build.built_library(cc) == built  # a second process: loads, never rebuilds


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
def test_engine_greedy_equals_solo_on_the_kernel(model, threads, monkeypatch):
    torch.set_num_threads(threads)  # (conftest sets one thread again before each test)
    calls = []  # the attention alone, or inside a whole layer
    for name in ("decode_attention", "decoder_layers"):
        real = getattr(native, name)
        monkeypatch.setattr(native, name, lambda *a, real=real, **kw: calls.append(1) or real(*a, **kw))
    reqs = with_early_eos(model, mixed_workload(16, seed=11))
    res, stats = run_continuous(model, reqs, 8, kv="paged", block_size=4, chunked_prefill=True, max_batched_tokens=64)
    assert [r.tokens for r in res] == solo_outputs(model, reqs)
    assert stats["kv_allocated_at_end"] == 0
    assert len(calls) >= stats["decode_steps"], "the decode rows did not run on the kernel"


@needs_kernel
def test_kernel_and_pytorch_paths_give_the_same_logits(model, monkeypatch):
    """The model over one ragged batch (decodes at many lengths, and a prefill chunk) on a pool
    of random K/V, once per decode attention: the logits agree to float precision."""
    from tests.test_ragged_attention import filled_pool
    from tinyllm.kv.ragged import RaggedAttention

    cfg = model.cfg
    lens = [1, 7, 16, 17, 40, 63, 30]
    pool = filled_pool(lens, 4, hkv=cfg.n_kv_heads, d=cfg.head_dim, seed=9, layers=cfg.n_layers)
    items = [(slot, n - 1, 1) for slot, n in enumerate(lens[:-1])] + [(6, 20, 10)]
    tokens = torch.tensor([[random.Random(i).randrange(cfg.vocab_size) for i in range(len(lens) - 1 + 10)]])
    logits = {}
    for flag in ("1", "0"):
        monkeypatch.setattr(native, "ENABLED", flag == "1")
        attn = RaggedAttention(pool, items)
        assert (attn._native is not None) == (flag == "1")
        with torch.no_grad():
            logits[flag], _ = model(tokens, cache=attn)
    torch.testing.assert_close(logits["1"], logits["0"], rtol=1e-4, atol=1e-4)


@needs_kernel
def test_a_plan_for_the_kernel_falls_back_when_a_layer_cannot_use_it():
    """The step planned for the kernel (CPU float32 pool), but a query that records autograd
    arrives: that layer runs PyTorch's path (built then), with the same values and a gradient."""
    from tests.test_ragged_attention import filled_pool
    from tests.test_ragged_attention import reference as one_row
    from tinyllm.kv.ragged import RaggedAttention

    lens = [12, 5, 30]
    pool = filled_pool(lens, 4, d=16, seed=2)
    items = [(slot, n - 1, 1) for slot, n in enumerate(lens)]
    attn = RaggedAttention(pool, items)
    assert attn._native is not None
    q = torch.randn(1, 4, len(items), 16, requires_grad=True)
    out = attn.attend(0, q, pool.k[0, attn._write].transpose(0, 1)[None], pool.v[0, attn._write].transpose(0, 1)[None])
    assert attn._decode is not None and out.grad_fn is not None
    for i, (slot, start, _) in enumerate(items):
        torch.testing.assert_close(
            out[0, :, i].detach(), one_row(pool, slot, q[0, :, i].detach(), start), rtol=1e-5, atol=1e-5
        )


@needs_kernel
@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda a: {**a, "tables": a["tables"].int()}, "int64 tables"),
        (lambda a: {**a, "lens": a["lens"].int()}, "int64 tables and lens"),
        (lambda a: {**a, "tables": a["tables"] + 1000}, "block ids in 0.."),
        (lambda a: {**a, "tables": a["tables"] - 1000}, "block ids in 0.."),
        (lambda a: {**a, "lens": a["lens"] * 0}, "lens in 1.."),
        (lambda a: {**a, "lens": a["lens"] + 1000}, "lens in 1.."),
        (lambda a: {**a, "lens": a["lens"][:-1]}, "tables (3, width) and lens (3,)"),
        (lambda a: {**a, "v": a["v"][:, :1].contiguous()}, "k, v of shape"),
        (lambda a: {**a, "k": a["k"].double()}, "a float32 q and a float32 or bfloat16 k/v"),
        (lambda a: {**a, "k": a["k"].bfloat16()}, "a float32 q and a float32 or bfloat16 k/v"),  # v float32
        (lambda a: {**a, "q": a["q"].bfloat16()}, "a float32 q and a float32 or bfloat16 k/v"),
        (lambda a: {**a, "k": a["k"][:, :, :8]}, "k, v of shape"),
        (lambda a: {**a, "v": a["v"].transpose(0, 1).contiguous().transpose(0, 1)}, "contiguous"),
        (lambda a: {**a, "row_table": torch.tensor([0, 1, 3])}, "row_table entries in 0..2"),
        (lambda a: {**a, "row_table": torch.tensor([0, 1])}, "int64 row_table (3,)"),
        (lambda a: {**a, "row_table": torch.tensor([0, 1, 2]).int()}, "int64 row_table (3,)"),
        (lambda a: {**a, "tables": a["tables"][:0], "row_table": torch.tensor([0, 0, 0])}, "tables (n, width)"),
    ],
)
def test_arguments_the_c_code_would_misread_are_refused(bad, message):
    """The C code reads raw pointers: every argument that would send it out of bounds (an int32
    table, a block id past the pool, a length past the table) is a ValueError instead."""
    lens = [5, 9, 3]
    tables, n_blocks = scattered_tables(lens, 4, seed=1)
    args = {
        "q": torch.randn(4, 3, 16),
        "k": pool(n_blocks, 4, 2, 16),
        "v": pool(n_blocks, 4, 2, 16),
        "tables": tables,
        "lens": torch.tensor(lens),
        "block_size": 4,
    }
    native.decode_attention(**args)  # as given: fine
    with pytest.raises(ValueError, match="paged decode attention needs") as e:
        native.decode_attention(**bad(args))
    assert message in str(e.value)


def test_a_compiler_that_fails_strangely_still_falls_back_with_a_reason(monkeypatch, tmp_path):
    """A compiler whose error output is not UTF-8: the build fails, library() says why (and keeps
    saying it), nothing escapes."""
    cc = tmp_path / "cc"
    cc.write_bytes(b"#!/bin/sh\nprintf '\\377\\376 broken' >&2\nexit 1\n")
    cc.chmod(0o755)
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setenv("TINYLLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native.build, "compiler", lambda: str(cc))
    assert native.library() is None and "build failed" in native.why_not and "broken" in native.why_not
    assert native.library() is None and "build failed" in native.why_not
    assert "build failed" in native.describe()


@needs_kernel
def test_another_cpu_gets_its_own_build(monkeypatch, tmp_path):
    """Built for this CPU (-march=native): a cache shared with another machine must not hand it
    this build (an illegal instruction kills the process). The CPU is part of the key. Each
    "build" is a copy of this process's library (the key, not the compiler, is under test)."""
    good = Path(native.library()._name).read_bytes()

    def copy(cc, sources, openmp, native_flags, defs, out: Path) -> Path:
        out.write_bytes(good)
        out.chmod(0o755)
        return out

    monkeypatch.setattr(native.build, "_compile", copy)
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setenv("TINYLLM_CACHE", str(tmp_path))
    assert native.library() is not None
    monkeypatch.setattr(native, "_tried", False)
    real = native.build._machine_id
    monkeypatch.setattr(native.build, "_machine_id", lambda cc: real(cc) + " another cpu")
    assert native.library() is not None
    assert len(list((tmp_path / "kernels").glob("*.so"))) == 2


@pytest.mark.skipif(
    not native.build._torch_uses_libgomp(), reason="no -fopenmp build is tried here (PyTorch is not on libgomp)"
)
def test_a_build_that_does_not_load_is_not_kept_the_next_flags_are_tried(one_kernel, tmp_path):
    """clang takes -fopenmp and compiles calls into its own runtime (libomp), which the library
    then lacks: it built, but "undefined symbol: __kmpc_..." at load, and the engine ran on
    PyTorch. A compiler like that here: whatever it builds with -fopenmp needs a symbol nothing
    defines (and nothing else: no time spent compiling the kernels twice to throw them away).
    The build without -fopenmp is the one kept, and it runs."""
    missing = tmp_path / "missing.c"
    missing.write_text("extern void no_such_runtime(void);\nvoid tinyllm_needs_it(void) { no_such_runtime(); }\n")
    cc = tmp_path / "cc"
    cc.write_text(
        '#!/bin/sh\ncase " $* " in *" -fopenmp "*)\n'
        '  for a do shift; case "$a" in *.c) ;; *) set -- "$@" "$a" ;; esac; done\n'
        '  exec gcc "$@" ' + str(missing) + ' ;;\nesac\nexec gcc "$@"\n'
    )
    cc.chmod(0o755)
    built = native.build.built_library(str(cc))
    assert not hasattr(ctypes.CDLL(str(built)), "tinyllm_needs_it")  # the -fopenmp build was not kept
    x = torch.randn(3, 50)
    assert torch.equal(argmax_of(built, x), x.argmax(dim=-1, keepdim=True))


# -- RMSNorm (csrc/rms_norm.c) ------------------------------------------------------------------


def torch_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * torch.nn.functional.rms_norm(x, (x.size(-1),), eps=eps)


@needs_kernel
@pytest.mark.parametrize("shape", [(1, 1, 256), (2, 37, 256), (5, 17), (3, 1), (0, 64), (700, 96)])
@pytest.mark.parametrize("scale", [1.0, 1e4, 1e-20])
def test_rms_norm_matches_pytorch(shape, scale):
    """Every row, any leading shape (700 x 96 runs on several threads), huge and tiny values
    (eps keeps an all-but-zero row finite)."""
    torch.set_num_threads(2)
    torch.manual_seed(len(shape) + shape[-1])
    x, w = torch.randn(shape) * scale, torch.randn(shape[-1])
    y = native.rms_norm(x, w, 1e-5)
    assert y is not None and y.shape == x.shape and torch.isfinite(y).all()
    torch.testing.assert_close(y, torch_rms_norm(x, w, 1e-5), rtol=2e-6, atol=1e-6)


@needs_kernel
def test_rms_norm_reads_strided_rows_and_leaves_its_input_alone():
    base = torch.randn(6, 10, 32)
    x = base.transpose(0, 1)  # (10, 6, 32): rows not in memory order
    keep = x.clone()
    w = torch.rand(32)
    torch.testing.assert_close(native.rms_norm(x, w, 1e-6), torch_rms_norm(x, w, 1e-6), rtol=2e-6, atol=1e-6)
    assert torch.equal(x, keep)
    wide = torch.randn(4, 64)[:, ::2]  # last dim strided: copied first
    torch.testing.assert_close(native.rms_norm(wide, w, 1e-6), torch_rms_norm(wide, w, 1e-6), rtol=2e-6, atol=1e-6)


@needs_kernel
def test_rms_norm_leaves_autograd_and_other_dtypes_to_pytorch():
    w = torch.nn.Parameter(torch.ones(8))
    x = torch.randn(3, 8)
    assert native.rms_norm(x, w, 1e-5) is None  # grad on: the weight records autograd
    with torch.no_grad():
        assert native.rms_norm(x, w, 1e-5) is not None
        assert native.rms_norm(x.bfloat16(), w.bfloat16(), 1e-5) is None
        assert native.rms_norm(x.double(), w.double(), 1e-5) is None
        assert native.rms_norm(x, torch.ones(9), 1e-5) is None


@needs_kernel
def test_the_model_norms_run_in_c_and_give_pytorchs_logits(model, monkeypatch):
    calls = []
    real = native.rms_norm
    monkeypatch.setattr(native, "rms_norm", lambda *a: calls.append(1) or real(*a))
    tokens = torch.tensor([[random.Random(i).randrange(model.cfg.vocab_size) for i in range(20)]])
    with torch.no_grad():
        ours, _ = model(tokens)
        assert len(calls) == 2 * model.cfg.n_layers + 1  # two per block and the final norm
        monkeypatch.setattr(native, "ENABLED", False)
        theirs, _ = model(tokens)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


# -- RoPE, K/V store, argmax (csrc/rope.c, kv_store.c, argmax.c) ----------------------------------


@needs_kernel
@pytest.mark.parametrize(
    "B,T,heads,rotated,D",
    [(1, 64, 8, 6, 64), (2, 5, 3, 2, 128), (1, 1, 2, 1, 20), (3, 7, 4, 4, 2), (1, 2048, 8, 6, 32)],
)
def test_rope_in_place_matches_pytorch_and_leaves_the_other_heads_alone(B, T, heads, rotated, D):
    """Each token at its own position (random, repeated, the table's last row); the heads past
    ``rotated`` (v) untouched; 2048 tokens x 6 heads x 32 runs on several threads."""
    from tinyllm.model.transformer import apply_rope, rope_tables

    torch.set_num_threads(2)
    torch.manual_seed(B * T + D)
    cos, sin = rope_tables(D, 512, 10000.0)
    pos = torch.randint(0, 512, (B, T))
    pos[0, 0] = 511
    x = torch.randn(B, T, heads, D)
    want = apply_rope(x.transpose(1, 2)[:, :rotated], cos[pos].unsqueeze(1), sin[pos].unsqueeze(1))
    rest = x[:, :, rotated:].clone()
    assert native.rope_(x, pos, cos, sin, rotated)
    torch.testing.assert_close(x.transpose(1, 2)[:, :rotated], want, rtol=1e-6, atol=1e-6)
    assert torch.equal(x[:, :, rotated:], rest)


@needs_kernel
def test_rope_refuses_what_it_would_misread():
    from tinyllm.model.transformer import rope_tables

    cos, sin = rope_tables(16, 32, 10000.0)
    x, pos = torch.randn(1, 4, 3, 16), torch.arange(4)[None]
    with pytest.raises(ValueError, match=r"rotary positions must be in 0..31"):
        native.rope_(x, pos + 29, cos, sin, 2)
    with pytest.raises(ValueError, match="rotary positions"):
        native.rope_(x, pos - 1, cos, sin, 2)
    keep = x.clone()
    wide = torch.randn(1, 4, 3, 32)
    assert not native.rope_(wide[..., ::2], pos, cos, sin, 2)  # head dim strided
    assert not native.rope_(wide[..., :16], pos, cos, sin, 2)  # heads 32 apart, D 16
    assert not native.rope_(torch.randn(4, 3, 1, 16).permute(2, 0, 1, 3), pos, cos, sin, 2)  # tokens not row-major
    overlapping = torch.randn(1, 1, 3, 16).expand(2, 4, 3, 16)  # every token the same memory
    assert not native.rope_(overlapping, pos.expand(2, 4), cos, sin, 2)
    assert not native.rope_(x.double(), pos, cos.double(), sin.double(), 2)
    assert not native.rope_(x, pos.int(), cos, sin, 2)
    assert not native.rope_(x, pos, cos[:, :8], sin[:, :8], 2)
    assert not native.rope_(x, pos, cos, sin, 4)  # more heads than it has
    assert not native.rope_(torch.randn(1, 4, 3, 15), pos, cos[:, :15], sin[:, :15], 2)  # odd head size
    assert not native.rope_(x.requires_grad_(), pos, cos, sin, 2)  # autograd: PyTorch's
    assert torch.equal(x.detach(), keep)


@needs_kernel
def test_kv_store_writes_each_token_to_its_row_and_nothing_else():
    pool_k, pool_v = torch.randn(40, 2, 8), torch.randn(40, 2, 8)
    before_k, before_v = pool_k.clone(), pool_v.clone()
    qkv = torch.randn(5, 4 + 2 + 2, 8)  # tokens' heads: q 4, k 2, v 2
    k, v = qkv[:, 4:6], qkv[:, 6:8]  # strided between tokens, like the model's
    write = torch.tensor([39, 0, 17, 3, 22])
    assert native.kv_store(k, v, write, pool_k, pool_v)
    before_k[write], before_v[write] = k, v
    assert torch.equal(pool_k, before_k) and torch.equal(pool_v, before_v)
    with pytest.raises(ValueError, match=r"KV write rows must be in 0..39"):
        native.kv_store(k, v, torch.tensor([0, 1, 2, 3, 40]), pool_k, pool_v)
    assert torch.equal(pool_k, before_k)
    assert not native.kv_store(k, v, write.int(), pool_k, pool_v)
    heads_apart = torch.randn(5, 2, 16)[:, :, :8]  # a token's heads not contiguous
    assert not native.kv_store(heads_apart, heads_apart, write, pool_k, pool_v)
    assert not native.kv_store(k, v.contiguous(), write, pool_k, pool_v)  # k and v strided differently
    assert not native.kv_store(k, v, write, pool_k[:, :1], pool_v[:, :1])
    assert not native.kv_store(k, v, write[:4], pool_k, pool_v)


@needs_kernel
def test_argmax_on_many_rows_splits_them_over_threads_and_matches_pytorch():
    """64 rows of 4,096 on two threads (the kernel splits rows past 65,536 values), ties and NaNs
    planted in rows each thread gets."""
    torch.set_num_threads(2)
    torch.manual_seed(4)
    x = torch.randn(64, 4096)
    x[3, 10] = x[3, 20] = x[60, 5] = x[60, 4090] = 40.0
    x[33, 7] = x[33, 2] = float("nan")
    assert torch.equal(native.argmax(x), x.argmax(dim=-1, keepdim=True))


@needs_kernel
def test_argmax_matches_pytorch_on_ties_nan_and_infinities():
    torch.manual_seed(3)
    x = torch.randn(9, 4096)
    x[1, 7] = x[1, 4000] = 50.0  # a tie: the first index
    x[2, 100] = float("nan")
    x[2, 5] = float("nan")  # NaN wins, the first one
    x[3] = float("-inf")  # nothing finite: index 0
    x[4, 4095] = float("inf")
    x[5, :] = 1.0  # all equal
    x[6, 0] = 99.0
    for rows in (x, x[:, :1], x[:, 2:], x[::2]):  # one column, offset and strided rows
        torch.testing.assert_close(native.argmax(rows), rows.argmax(dim=-1, keepdim=True), rtol=0, atol=0)
    assert native.argmax(x.double()) is None and native.argmax(x[:, ::2]) is None
    assert native.argmax(x[:0]).shape == (0, 1)
    assert native.argmax(torch.randn(9, 0)) is None


@needs_kernel
@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 127, 128, 129, 200])
def test_argmax_finds_the_first_maximum_on_either_side_of_its_64_value_chunks(n):
    """The kernel looks for the maximum 64 values at a time: ties within a chunk, across chunks,
    at a chunk's last and the next one's first value, and at the row's very end."""
    torch.manual_seed(n)
    rows = []
    for at in sorted({0, 62, 63, 64, 65, 127, 128, n - 1} & set(range(n))):
        for also in sorted({at + 1, at + 64, n - 1} & set(range(at + 1, n))) or [None]:
            r = torch.randn(n)
            r[at] = 9.0
            if also is not None:
                r[also] = 9.0
            rows.append(r)
    x = torch.stack(rows)
    assert torch.equal(native.argmax(x), x.argmax(dim=-1, keepdim=True))


@needs_kernel
@pytest.mark.parametrize("whole_layers", [True, False], ids=["layers-in-c", "op-by-op"])
def test_greedy_sampling_and_the_model_use_the_kernels(model, monkeypatch, whole_layers):
    """The engine's steps go through the C kernels: every decoder layer and the final norm in one C
    call a forward (``decoder_layers``), or, with that turned off, the RoPE, K/V store, SwiGLU and linear layers one
    by one; argmax and the vocabulary projection either way. A kernel is counted only when it ran
    (answered True or a tensor), not when it declined and PyTorch ran instead."""
    from tinyllm.model.c_layers import CLayers

    reqs = with_early_eos(model, mixed_workload(6, seed=5))
    want = solo_outputs(model, reqs)  # (before counting: solo runs op by op)
    if not whole_layers:
        monkeypatch.setattr(CLayers, "plan", classmethod(lambda cls, *a: None))
    calls = {"rope_": 0, "kv_store": 0, "argmax": 0, "silu_mul": 0, "linear": 0, "decoder_layers": 0}
    for name in calls:
        real = getattr(native, name)

        def counted(*a, _real=real, _name=name, **kw):
            out = _real(*a, **kw)
            calls[_name] += out is not False and out is not None
            return out

        monkeypatch.setattr(native, name, counted)
    res, stats = run_continuous(model, reqs, 4, kv="paged", block_size=4, chunked_prefill=True, max_batched_tokens=32)
    assert [r.tokens for r in res] == want
    per_layer = stats["decode_steps"] * model.cfg.n_layers
    forwards = stats["decode_steps"]  # (one ragged forward a step)
    sampling_steps = max(len(r.tokens) for r in res)  # a step samples each of a request's tokens
    assert calls["argmax"] >= sampling_steps
    if whole_layers:
        assert calls["decoder_layers"] >= forwards
        assert calls["rope_"] == calls["kv_store"] == calls["silu_mul"] == 0
        assert calls["linear"] >= sampling_steps  # lm_head
    else:
        assert calls["decoder_layers"] == 0
        assert calls["kv_store"] >= per_layer and calls["rope_"] >= per_layer and calls["silu_mul"] >= per_layer
        assert calls["linear"] >= stats["decode_steps"] * (4 * model.cfg.n_layers + 1)  # qkv, o, gate/up, down; lm_head


@needs_kernel
@pytest.mark.parametrize("shape", [(64, 1408), (1, 5, 2 * 704), (3, 2), (700, 96), (0, 8)])
def test_silu_mul_matches_pytorch(shape):
    """Large positive and negative gates (exp never overflows), zero, any leading shape (700 x 48
    runs on several threads)."""
    torch.set_num_threads(2)
    torch.manual_seed(shape[-1])
    x = torch.randn(shape) * 6
    flat = x.view(-1, shape[-1])
    flat[:1, 0], flat[1:2, 0], flat[2:3, 0] = -200.0, 200.0, 0.0  # gates (column 0 is a gate)
    flat[3:4, 0] = -1e30  # e^-1e30: exactly 0, silu -0
    gate, up = x.chunk(2, dim=-1)
    y = native.silu_mul(x)
    assert y is not None and y.shape == gate.shape and torch.isfinite(y).all()
    torch.testing.assert_close(y, torch.nn.functional.silu(gate) * up, rtol=2e-6, atol=2e-6)
    if flat.size(0) > 3:
        assert y.view(-1, shape[-1] // 2)[3, 0] == 0


@needs_kernel
def test_silu_mul_reads_strided_input_and_leaves_the_rest_to_pytorch():
    x = torch.randn(8, 2, 32).transpose(0, 1)  # (2, 8, 32), not contiguous
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(native.silu_mul(x), torch.nn.functional.silu(gate) * up, rtol=2e-6, atol=2e-6)
    assert native.silu_mul(torch.randn(4, 7)) is None  # odd: not gate and up halves
    assert native.silu_mul(x.double()) is None
    assert native.silu_mul(torch.randn(4, 8, requires_grad=True)) is None


# -- linear layers (csrc/linear.c) ------------------------------------------------------------------


def packed_weight(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    w = torch.randn(n, k)
    return w, native.pack_linear(w)


@needs_kernel
def test_pack_linear_lays_the_weight_out_in_16_column_panels_zero_past_n():
    w, packed = packed_weight(37, 5)
    assert packed.shape == (3, 5, 16)
    for p in range(3):
        for j in range(16):
            expect = w[16 * p + j] if 16 * p + j < 37 else torch.zeros(5)
            assert torch.equal(packed[p, :, j], expect)


@needs_kernel
@pytest.mark.parametrize("m", [1, 2, 5, 6, 7, 11, 12, 13, 25, 96, 97, 200])
@pytest.mark.parametrize("n,k", [(16, 64), (40, 7), (1, 384), (33, 1), (24, 16), (64, 32)])
def test_linear_matches_f_linear(m, n, k):
    """Every tile height (1..6 rows on AVX2, 1..12 on AVX-512), row blocks past 96, panels cut
    short (n not a multiple of 16), panels taken in pairs (AVX-512) with a single one left over,
    a pair whose second panel is cut short."""
    torch.set_num_threads(2)
    w, packed = packed_weight(n, k, seed=m)
    x = torch.randn(m, k)
    torch.testing.assert_close(native.linear(x, packed, n), torch.nn.functional.linear(x, w), rtol=1e-5, atol=1e-5)


@needs_kernel
def test_a_rows_result_is_the_same_bits_in_any_batch_on_any_thread_count():
    """What greedy == solo rests on: each output a sum over k in order, whatever rows share the
    call (its tile of 6 or 12 rows, one or two panels, its block of 96) and however the panels are
    split across threads."""
    w, packed = packed_weight(100, 384)
    x = torch.randn(203, 384)
    try:
        torch.set_num_threads(2)
        batch = native.linear(x, packed, 100)
        torch.set_num_threads(1)
        alone = torch.cat([native.linear(x[i : i + 1], packed, 100) for i in range(203)])
        odd = torch.cat([native.linear(x[i : i + 7], packed, 100) for i in range(0, 203, 7)])
    finally:
        torch.set_num_threads(2)
    assert torch.equal(batch, alone) and torch.equal(batch, odd)


@needs_kernel
def test_linear_adds_a_residual_with_the_bits_of_adding_it_afterwards():
    w, packed = packed_weight(48, 32)
    x, res = torch.randn(2, 9, 32), torch.randn(2, 9, 48)
    y = native.linear(x, packed, 48, add=res)
    assert y.shape == (2, 9, 48) and torch.equal(y, res + native.linear(x, packed, 48))
    strided = torch.randn(48, 2, 9).permute(1, 2, 0)  # (2, 9, 48), not contiguous
    assert torch.equal(native.linear(x, packed, 48, add=strided), strided + native.linear(x, packed, 48))
    x_strided = torch.randn(32, 2, 9).permute(1, 2, 0)
    assert torch.equal(native.linear(x_strided, packed, 48, add=res), res + native.linear(x_strided, packed, 48))
    for n in (40, 24, 56):  # a last panel of 8 columns: alone (40), or second of a pair (24, 56)
        w, packed = packed_weight(n, 32)
        x, res = torch.randn(13, 32), torch.randn(13, n)
        assert torch.equal(native.linear(x, packed, n, add=res), res + native.linear(x, packed, n))


@needs_kernel
def test_linear_reads_strided_input_and_leaves_what_it_cannot_run_to_pytorch():
    w, packed = packed_weight(24, 16)
    x = torch.randn(16, 10).t()  # (10, 16), not contiguous
    torch.testing.assert_close(native.linear(x, packed, 24), x @ w.t(), rtol=1e-5, atol=1e-5)
    assert native.linear(torch.randn(0, 16), packed, 24).shape == (0, 24)
    assert native.linear(x.double(), packed, 24) is None
    assert native.linear(torch.randn(3, 16, requires_grad=True), packed, 24) is None
    assert native.linear(torch.randn(3, 15), packed, 24) is None  # K is not the packed weight's
    assert native.linear(x, packed, 40) is None  # nor is N (40 needs 3 panels)
    assert native.linear(x, packed[:, :, :8].contiguous(), 24) is None
    assert native.linear(x, torch.zeros(1, 16, 16).expand(2, 16, 16), 24) is None  # no memory behind it
    assert native.linear(torch._efficientzerotensor(5, 16), packed, 24) is None  # nor here (a null pointer)
    assert native.linear(x, packed.transpose(1, 2).contiguous().transpose(1, 2), 24) is None
    assert native.linear(x, packed, 24, add=torch.randn(10, 23)) is None
    assert native.pack_linear(w.double()) is None and native.pack_linear(torch.randn(3)) is None


def test_an_engine_builds_the_kernels_when_it_is_made_not_in_its_first_step(monkeypatch):
    """A first build takes seconds: made with the engine (the app's LOADING, the server's start-up),
    it does not land in the first request's TTFT."""
    from tests.helpers import random_model
    from tinyllm.engine import ContinuousEngine

    calls = []
    monkeypatch.setattr(native, "library", lambda: calls.append(1))
    ContinuousEngine(random_model(), 2, 64)
    assert calls


@needs_kernel
def test_a_steps_rows_built_in_c_are_the_ones_python_builds(monkeypatch):
    """ragged_rows.c against the Python loop it replaced (the path without a compiler): every
    token's position and pool row, for decodes and chunks, one-token chunks, a chunk across block
    edges; lengths are positions + 1 and each token reads its own slot's row of the pool's tables."""
    from tests.test_ragged_attention import filled_pool
    from tinyllm.kv.ragged import RaggedAttention

    lens = [1, 7, 16, 17, 40, 63, 30]
    pool = filled_pool(lens, 4, d=16, seed=5)
    items = [(0, 0, 1), (3, 16, 1), (4, 39, 1), (1, 3, 1), (5, 10, 23), (6, 0, 30), (2, 15, 1)]
    monkeypatch.setattr(native, "ENABLED", False)
    python = RaggedAttention(pool, items)
    monkeypatch.setattr(native, "ENABLED", True)
    c = RaggedAttention(pool, items)
    assert python._native is None and c._native is not None
    assert c._pos.tolist() == python._pos.tolist() and c._write.tolist() == python._write.tolist()
    tables, lens_, row_table = c._native
    assert lens_.tolist() == [p + 1 for p in c._pos.tolist()]
    assert row_table.tolist() == [slot for slot, _, n in items for _ in range(n)]
    assert tables is pool.table_rows and c.total == python.total == sum(n for _, _, n in items)
    with pytest.raises(ValueError, match="ragged items hold 3 tokens, not the 2 given"):
        native.ragged_rows([(0, 0, 1), (1, 0, 2)], pool.table_rows, pool.block_size, pool.n_blocks, 2)
    with pytest.raises(ValueError, match="ragged items hold 3 tokens, not the 4 given"):
        native.ragged_rows([(0, 0, 1), (1, 0, 2)], pool.table_rows, pool.block_size, pool.n_blocks, 4)
    with pytest.raises(ValueError, match="block_size >= 1"):
        native.ragged_rows([(0, 0, 1)], pool.table_rows, 0, pool.n_blocks, 1)


def test_the_layer_step_takes_every_field_by_name_and_no_other():
    """ctypes keeps a misspelled keyword as a Python attribute and leaves the real field zero: a
    NULL pointer for the C code. LayerStep refuses both ways of getting a name wrong."""
    from tinyllm.native.abi import LayerStep

    every = {name: 1 for name, _ in LayerStep._fields_}
    assert LayerStep(**every).tokens == 1
    with pytest.raises(TypeError, match=r"unknown \['tokenz'\], missing \['tokens'\]"):
        LayerStep(**{("tokenz" if k == "tokens" else k): v for k, v in every.items()})
