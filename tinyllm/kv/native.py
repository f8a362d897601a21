"""The CPU paged-attention kernel (``paged_attention.c``): built on first use, loaded with ctypes.

Why C, and why this way: on CPU the PyTorch decode attention copies every row's blocks into a
dense window once per layer and step, then reads them again (`kv/ragged.py`); the kernel reads the
blocks in place. It is plain C without PyTorch headers, so the system C compiler builds it in well
under a second (a PyTorch C++ extension takes about a minute on two cores); the shared library is
cached per source, compiler and machine under ``$TINYLLM_CACHE`` (default
``~/.cache/tinyllm``). Where no compiler is found, or the build fails, ``kernel()`` says so once
in the log (info level) and returns None, and attention stays on the PyTorch path: the kernel is a
speed-up, never a requirement. ``TINYLLM_NATIVE=0`` turns it off (for A/B measurements).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import Tensor

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("paged_attention.c")
FLAGS = ["-O3", "-fPIC", "-shared", "-fopenmp-simd", "-fno-math-errno"]
MAX_GROUP = 64                       # query heads per KV head the kernel handles (its stack arrays)

_kernel: ctypes._CFuncPtr | None = None
_tried = False
why_not = ""                         # why the kernel is not in use (for the bench and the log)


def enabled() -> bool:
    """The kernel is wanted: not turned off by ``TINYLLM_NATIVE=0``."""
    return os.environ.get("TINYLLM_NATIVE", "1").strip() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    root = os.environ.get("TINYLLM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "tinyllm")
    return Path(root) / "kernels"


def _compiler() -> str | None:
    return next((c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)


def _torch_uses_libgomp() -> bool:
    """PyTorch's OpenMP runtime is GNU libgomp (Linux wheels): a kernel built with -fopenmp then
    shares its thread pool (same soname, already loaded). Anything else (macOS's libomp, Intel's)
    would be a second pool fighting the first for the cores: the kernel is built serial there."""
    try:
        return "libgomp" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def _build(cc: str) -> Path:
    """The shared library for this source and compiler, built unless cached. Written to a temporary
    name and renamed, so processes building at once (test workers) never load a half-written file."""
    src = SOURCE.read_bytes()
    openmp = ["-fopenmp"] if _torch_uses_libgomp() else []
    native = ["-march=native"] if platform.machine() in ("x86_64", "AMD64") else ["-mcpu=native"]
    key = hashlib.sha256(src + " ".join([cc, *FLAGS, *openmp, platform.machine(), sys.platform]).encode())
    out = cache_dir() / f"paged_attention-{key.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        for arch in (native, []):                   # -march=native where the compiler knows it
            r = subprocess.run([cc, *FLAGS, *openmp, *arch, "-o", tmp, str(SOURCE), "-lm"],
                               capture_output=True, text=True, timeout=120)
            if r.returncode == 0:
                os.replace(tmp, out)
                return out
        raise RuntimeError(f"{cc} failed: {r.stderr.strip()[-400:]}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def kernel() -> ctypes._CFuncPtr | None:
    """The compiled ``paged_decode_attention``, or None (no compiler, a failed build, or turned
    off); the build is tried once per process."""
    global _kernel, _tried, why_not
    if not enabled():
        why_not = "turned off (TINYLLM_NATIVE=0)"
        return None
    if _tried:
        return _kernel
    _tried = True
    cc = _compiler()
    if cc is None:
        why_not = "no C compiler found (cc, gcc, clang)"
    else:
        try:
            lib = ctypes.CDLL(str(_build(cc)))
            fn = lib.paged_decode_attention
            i64, ptr = ctypes.c_int64, ctypes.c_void_p
            fn.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, ptr, i64, i64,
                           i64, i64, i64, i64, i64, ctypes.c_float, ctypes.c_int]
            fn.restype = ctypes.c_int
            _kernel = fn
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            why_not = f"build failed ({e})"
    if _kernel is None:
        log.info("paged attention stays on PyTorch: %s", why_not)
    return _kernel


def describe() -> str:
    """Which decode attention a CPU float32 paged pool runs, for the bench's report."""
    return "C kernel (kv/paged_attention.c)" if kernel() is not None else f"PyTorch: {why_not}"


def usable(q: Tensor, pool: Tensor) -> bool:
    """The kernel can run this attention: CPU, float32 query and pool, at most MAX_GROUP query
    heads per KV head, not recording autograd (it has no backward)."""
    return (q.device.type == "cpu" and pool.device.type == "cpu" and q.dtype == torch.float32
            and pool.dtype == torch.float32 and not (torch.is_grad_enabled() and q.requires_grad)
            and q.size(-3) // pool.size(1) <= MAX_GROUP and kernel() is not None)


def decode_attention(q: Tensor, k: Tensor, v: Tensor, tables: Tensor, lens: Tensor,
                     block_size: int) -> Tensor:
    """Decode attention over a paged pool, read in place.

    q: (H, rows, D), last dim contiguous; k, v: one layer's pool (tokens, Hkv, D), contiguous;
    tables: (rows, width) int64 block ids; lens: (rows,) int64, the positions each row attends
    (0 .. lens-1, through its table). Returns (H, rows, D): a view of a (rows, H, D) tensor, so
    the model's transpose back to token-major costs no copy."""
    H, rows, D = q.shape
    if q.stride(-1) != 1:
        q = q.contiguous()
    if not (k.is_contiguous() and v.is_contiguous() and tables.is_contiguous() and lens.is_contiguous()):
        raise ValueError("decode_attention: pool, tables and lens must be contiguous")
    out = torch.empty(rows, H, D, dtype=q.dtype, device=q.device)
    rc = kernel()(q.data_ptr(), q.stride(1), q.stride(0), k.data_ptr(), v.data_ptr(),
                  tables.data_ptr(), tables.size(1), lens.data_ptr(),
                  out.data_ptr(), out.stride(0), out.stride(1),
                  rows, H, k.size(1), D, block_size, D ** -0.5, torch.get_num_threads())
    if rc != 0:
        raise RuntimeError({1: "paged attention kernel: out of memory for its scores",
                            3: "paged attention kernel: unsupported head layout"}.get(rc, f"kernel error {rc}"))
    return out.transpose(0, 1)
