"""A decode step taken apart: model forward + sampling + the rest (scheduling, KV bookkeeping,
Python), all timed inside the same steps (so the parts add up to the step), against the time the
same rows' matmuls alone take on this machine (the practical limit): through the step's own
kernel and through PyTorch's GEMM, the faster of the two being the floor."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from tinyllm.engine import ContinuousEngine, Request, commit
from tinyllm.engine.forward import kv_bytes_per_token
from tinyllm.model.transformer import Transformer


def _timeit(fn, n: int) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn()
    sync()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t) / n


@torch.no_grad()
def matmul_only_s(model: Transformer, rows: int, n: int = 200, library: bool = False) -> float:
    """Time of just the decode step's weight matmuls for ``rows`` rows: every Linear (lm_head
    too) called on its own, so through the same kernel the step uses (on CPU, the packed weights
    of model/linear.py: the C kernel, or oneDNN without a compiler). ``library``: the same
    matmuls through PyTorch's own GEMM instead (``F.linear`` on the weight: MKL or oneDNN on
    CPU), the other candidate for the floor: our kernel's time alone would let a slow kernel
    make the rest of the step look small."""
    device = next(model.parameters()).device
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    xs = {m.in_features: torch.randn(rows, m.in_features, device=device) for m in linears}

    def run():
        for m in linears:
            if library:
                F.linear(xs[m.in_features], m.weight)
            else:
                m(xs[m.in_features])
        if device.type == "cuda":
            torch.cuda.synchronize()

    return _timeit(run, n)


def read_gbps(nbytes: int, device: torch.device, n: int = 10) -> float:
    """GB/s at which this machine reads ``nbytes`` once (a sum over a float32 buffer that size, on
    PyTorch's threads): the rate a step's attention could read its K/V at, at best. Repeated reads
    of one buffer may find part of it in a cache, so this errs fast, and the K/V floor low."""
    buf = torch.ones(max(1024, nbytes // 4), device=device)
    return buf.numel() * 4 / _timeit(buf.sum, n) / 1e9


def peak_gflops(device: str, size: int = 1024, n: int = 20) -> float:
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)

    def run():
        torch.mm(a, b)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()

    return 2 * size**3 / _timeit(run, n) / 1e9


@contextmanager
def _wrapped(obj, name: str, wrap: Callable[[Callable], Callable]) -> Iterator[None]:
    """``obj.name`` replaced by ``wrap(obj.name)`` while inside, then put back as it was."""
    own = name in vars(obj)  # a module global, or a method looked up on the class
    orig = getattr(obj, name)
    setattr(obj, name, wrap(orig))
    try:
        yield
    finally:
        if own:
            setattr(obj, name, orig)
        else:
            delattr(obj, name)


@contextmanager
def step_parts(eng: ContinuousEngine) -> Iterator[dict[str, float]]:
    """While inside: seconds the engine's steps spend in the model forward (or its CUDA-graph
    replay) and in sampling, summed. Timed inside the very steps whose total is timed, the parts
    are nested intervals of it and cannot add up to more than the step (timed on separate calls
    after the steps, at longer contexts, without the step's autocast, in another moment of a noisy
    machine, they used to exceed it). On CUDA each part is synchronized at both ends, so the
    kernels it queues are charged to it."""
    sync = torch.cuda.synchronize if eng.device.type == "cuda" else (lambda: None)
    spent = {"forward": 0.0, "sampling": 0.0}

    def timed(part: str) -> Callable[[Callable], Callable]:
        def wrap(fn: Callable) -> Callable:
            def run(*args, **kwargs):
                sync()
                t = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    sync()
                    spent[part] += time.perf_counter() - t

            return run

        return wrap

    forward = (eng.decoder, "step") if eng.decoder is not None else (eng.model, "forward")
    with _wrapped(*forward, timed("forward")), _wrapped(commit, "sample_batch", timed("sampling")):
        yield spent


@torch.no_grad()
def decode_anatomy(
    model: Transformer,
    slots: int = 16,
    ctx: int = 96,
    n: int = 40,
    kv: str = "slots",
    cuda_graph: bool = False,
    kv_cache_dtype: str = "auto",
    rounds: int = 4,
    warm: int = 3,
) -> dict:
    """Where one decode step with every slot active goes (with cuda_graph: the graph-replayed step;
    kv="chunked": the token-budget scheduler's step, all rows decoding, one ragged forward), as the
    mean of ``n`` steps: forward + sampling + other = step, where other (scheduling, KV
    bookkeeping, Python) is the remainder of the same steps. The steps and the matmul-only time
    they are set against are measured in turns (``rounds`` times n / rounds steps, then the
    matmuls), so the drift of a noisy machine (±30% from minute to minute on this project's)
    falls on both alike. Each turn starts untimed, since a server's steps follow one another:
    ``warm`` steps before a round's timed ones (the first steps after the matmul passes, their
    K/V pushed out of the caches, ran 1.2-1.8x a steady step, easing over about three:
    docs/benchmarks.md), one call before each matmul timing (``_timeit``).

    The matmuls are not the step's only floor: its attention reads every row's K/V once, bytes no
    kernel can skip. ``kv_read_mb`` is what a timed step reads (the rows' contexts at least: the
    slot path's dense attention may read more), ``kv_read_floor_ms`` that at the rate this machine
    reads a buffer that size (``read_gbps``), and ``step_over_matmul_and_kv`` the step against
    both floors added: what is left above 1 is the kernels' and Python's own."""
    vocab = model.cfg.vocab_size
    chunked = kv == "chunked"
    rounds, warm = max(1, min(rounds, n)), max(1, warm)
    steps = n + rounds * warm  # timed and untimed decode steps
    eng = ContinuousEngine(
        model,
        slots,
        max_len=min(model.cfg.max_seq_len, ctx + steps + 8),
        kv="paged" if chunked else kv,
        cuda_graph=cuda_graph,
        chunked_prefill=chunked,
        max_batched_tokens=max(slots, ctx * slots) if chunked else None,
        kv_cache_dtype=kv_cache_dtype,
    )
    rng = random.Random(1)
    for _ in range(slots):
        eng.add_request(Request([rng.randrange(1, vocab) for _ in range(ctx)], steps + 4))
    eng.step()  # admit (and prefill) everyone
    assert sum(eng.slots.active) == slots
    sync = torch.cuda.synchronize if eng.device.type == "cuda" else (lambda: None)
    bytes_per_token = kv_bytes_per_token(model, eng.device, kv_cache_dtype)
    step_s = mm_s = lib_s = kv_bytes = gbps = 0.0
    with step_parts(eng) as parts:
        for r in range(rounds):
            before = dict(parts)
            for _ in range(warm):
                eng.step()
            parts.update(before)  # (the warm steps' parts not counted)
            for _ in range(n * (r + 1) // rounds - n * r // rounds):  # n steps in all
                kv_bytes += bytes_per_token * sum(seq.context_len() for seq in eng._running)
                sync()
                t = time.perf_counter()
                eng.step()
                sync()
                step_s += time.perf_counter() - t
            mm_s += matmul_only_s(model, slots, n=max(1, 200 // rounds)) / rounds
            lib_s += matmul_only_s(model, slots, n=max(1, 200 // rounds), library=True) / rounds
            gbps += read_gbps(bytes_per_token * sum(seq.context_len() for seq in eng._running), eng.device) / rounds
    step_s, fwd_s, sample_s = step_s / n, parts["forward"] / n, parts["sampling"] / n
    floor_s = min(mm_s, lib_s)
    kv_step = kv_bytes / n  # K/V bytes a timed step's attention reads
    kv_floor_s = kv_step / (gbps * 1e9)  # at the rounds' mean read rate
    return {
        "active_rows": slots,
        "context": ctx,
        "steps": n,
        "step_ms": step_s * 1e3,
        "forward_ms": fwd_s * 1e3,
        "sampling_ms": sample_s * 1e3,
        "other_ms": max(0.0, step_s - fwd_s - sample_s) * 1e3,
        "matmul_only_ms": mm_s * 1e3,
        "library_matmul_ms": lib_s * 1e3,
        "matmul_floor_ms": floor_s * 1e3,
        "step_over_matmul": step_s / floor_s,
        "kv_read_mb": kv_step / 1e6,
        "read_gbps": gbps,
        "kv_read_floor_ms": kv_floor_s * 1e3,
        "step_over_matmul_and_kv": step_s / (floor_s + kv_floor_s),
        "matmul_gflops": 2
        * slots
        * sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
        / mm_s
        / 1e9,
    }
