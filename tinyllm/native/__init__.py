"""tinyllm's C kernels for CPU float32 (``tinyllm/csrc``): built on first use, loaded with ctypes.

- ``decode_attention`` (``paged_attention.c``): on CPU the PyTorch attention copies every
  sequence's blocks into a dense window once per layer and step, then reads them again
  (``kv/ragged.py``); the kernel reads the blocks in place, one query token per row: the decodes
  and the prefill chunks' tokens of a step in one call.
- ``rms_norm`` (``rms_norm.c``): one pass per row instead of PyTorch's six ops.
- ``rope_`` (``rope.c``): the rotary embedding in place on the fused qkv output, one pass instead
  of seven ops; ``kv_store`` (``kv_store.c``): a step's K and V rows into the pool in one call;
  ``argmax`` (``argmax.c``): greedy sampling (PyTorch's CPU argmax is not vectorized).
- ``linear`` (``linear.c``): the model's matmuls from a weight packed once (``pack_linear``):
  oneDNN's packed linear costs ~50 us a call before any arithmetic, and the C one gives a row the
  same bits in any batch (greedy == solo holds).
- ``ragged_rows`` (``ragged_rows.c``): a ragged step's per-token positions, pool rows, lengths
  and tables, built and range-checked in one pass.
- ``decoder_layers`` (``decoder_layer.c``): every decoder layer of a ragged step and the final
  norm, the kernels above called in the model's order from C (``model/c_layers.py`` fills its arguments): the same
  bits as calling them one by one, without the Python between them.

Each wrapper checks what the C code would otherwise trust (dtypes, shapes, strides, and the index
ranges unless the caller says an earlier call checked the same indices) and answers None or False
where it cannot run, so the caller takes PyTorch's path: the same results, within float rounding.

The package: this module holds the switch and the loaded library (``library()``) and names the
kernels; ``build`` builds and caches the library safely, ``abi`` declares its C signatures,
``attention`` and ``ops`` wrap its functions. Where no compiler is found, or the build fails,
``library()`` says so once in the log (info level) and returns None, and everything runs on
PyTorch: the kernels are a speed-up, never a requirement. ``TINYLLM_NATIVE=0`` in the environment
(or ``native.ENABLED = False``) turns them off.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading

from tinyllm.native import abi, build

log = logging.getLogger(__name__)

# Read once (the hot path asks per layer); tests set it directly.
ENABLED = os.environ.get("TINYLLM_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")

_lib: ctypes.CDLL | None = None
_tried = False
_lock = threading.Lock()  # the first library() call builds; concurrent callers wait for it
why_not = ""  # why the kernels are not in use (for the bench and the log)


def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None (no compiler, a failed build, an unsafe cache, or turned
    off); the build is tried once per process. Thread-safe: a caller that comes while the first
    one builds waits for its result (it never gets None meanwhile)."""
    global _lib, _tried, why_not
    if not ENABLED:
        why_not = "turned off (TINYLLM_NATIVE=0)"
        return None
    if _tried:
        return _lib
    with _lock:
        if _tried:
            return _lib
        cc = build.compiler()
        if cc is None:
            why_not = "no C compiler found (cc, gcc, clang)"
        else:
            try:
                _lib = abi.load(build.built_library(cc))
            except build.UnsafeCache as e:
                why_not = f"unsafe kernel cache: {e}"
                log.warning("C kernels not in use, PyTorch runs instead: %s", why_not)
            except Exception as e:  # whatever the toolchain does: PyTorch's path, said why
                why_not = f"build failed ({type(e).__name__}: {e})"
        if _lib is None:
            log.info("C kernels not in use, PyTorch runs instead: %s", why_not)
        _tried = True  # (after _lib: a caller that sees it sees the library)
    return _lib


def describe() -> str:
    """Which kernels a CPU float32 model runs (linear layers, attention, small ops), for the bench's report."""
    return (
        "C kernels (csrc/: linear layers, attention, RoPE, RMSNorm, SwiGLU, K/V store, argmax; "
        "the token-budget engine runs every decoder layer and the final norm in one call)"
        if library() is not None
        else f"PyTorch: {why_not}"
    )


# The kernels, named here (every caller writes ``native.<kernel>``); imported last: they call
# ``library()`` through this module, at call time.
from tinyllm.native.abi import LayerStep, LayerWeights  # noqa: E402
from tinyllm.native.attention import POOL_DTYPES, check_range, decode_attention, in_range, ragged_rows, usable  # noqa: E402
from tinyllm.native.build import UnsafeCache  # noqa: E402
from tinyllm.native.ops import argmax, decoder_layers, kv_store, linear, pack_linear, plain, rms_norm, rope_, silu_mul  # noqa: E402

__all__ = [
    "ENABLED",
    "POOL_DTYPES",
    "LayerStep",
    "LayerWeights",
    "UnsafeCache",
    "argmax",
    "check_range",
    "decode_attention",
    "decoder_layers",
    "describe",
    "in_range",
    "kv_store",
    "library",
    "linear",
    "pack_linear",
    "plain",
    "ragged_rows",
    "rms_norm",
    "rope_",
    "silu_mul",
    "usable",
    "why_not",
]
