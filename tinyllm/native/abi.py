"""The kernel library's C interface: the structs ``decoder_layer.c`` reads, each function's
signature (ctypes converts arguments by them), and the kernels' return codes."""

from __future__ import annotations

import ctypes
from pathlib import Path

from tinyllm.native.build import check_library


class LayerWeights(ctypes.Structure):
    """``decoder_layer.c``'s LayerWeights: one layer's norm weights, packed linear weights and pool."""

    _fields_ = [
        (name, ctypes.c_void_p)
        for name in ("input_norm", "post_attention_norm", "qkv", "o", "gate_up", "down", "k_pool", "v_pool")
    ]


class LayerStep(ctypes.Structure):
    """``decoder_layer.c``'s LayerStep: one forward's shapes, positions, attention plan and scratch."""

    _fields_ = [
        *((name, ctypes.c_int64) for name in ("tokens", "d", "H", "Hkv", "D", "F")),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        *((name, ctypes.c_void_p) for name in ("pos", "cos", "sin", "write", "tables", "row_table", "lens")),
        ("table_width", ctypes.c_int64),
        ("block_size", ctypes.c_int64),
        *((name, ctypes.c_void_p) for name in ("h", "qkv", "attn", "gate_up", "act")),
        ("threads", ctypes.c_int),
        ("kv_bf16", ctypes.c_int),
    ]

    def __init__(self, **fields) -> None:
        """Every field by name, each once: ctypes would keep a misspelled name as a Python
        attribute and leave the real field zero (a NULL pointer the C code reads)."""
        names = {name for name, _ in self._fields_}
        if fields.keys() != names:
            raise TypeError(
                f"LayerStep: unknown {sorted(fields.keys() - names)}, missing {sorted(names - fields.keys())}"
            )
        super().__init__(**fields)


def load(path: Path) -> ctypes.CDLL:
    """A built library with its functions' C signatures declared (ctypes converts by them),
    checked first (``check_library``: this user's, written by no one else)."""
    check_library(path)
    lib = ctypes.CDLL(str(path))
    i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    lib.paged_decode_attention.argtypes = [
        ptr,
        i64,
        i64,
        ptr,
        ptr,
        ptr,
        i64,
        ptr,
        ptr,
        ptr,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        f32,
        ctypes.c_int,
        ctypes.c_int,
    ]
    lib.paged_decode_attention.restype = ctypes.c_int
    lib.rms_norm.argtypes = [ptr, i64, ptr, ptr, i64, i64, i64, f32]
    lib.rope_inplace.argtypes = [ptr, i64, i64, i64, i64, ptr, ptr, ptr]
    lib.kv_store.argtypes = [ptr, ptr, i64, i64, i64, ptr, ptr, ptr, ctypes.c_int]
    lib.argmax_rows.argtypes = [ptr, i64, i64, i64, ptr]
    lib.silu_mul.argtypes = [ptr, i64, i64, i64, ptr]
    lib.linear_packed.argtypes = [ptr, i64, i64, i64, ptr, i64, ptr, i64, ptr, i64, ctypes.c_int]
    lib.pack_linear_weight.argtypes = [ptr, i64, i64, ptr]
    lib.decoder_layers.argtypes = [
        ctypes.POINTER(LayerWeights),
        i64,
        ctypes.POINTER(LayerStep),
        ptr,
        ptr,
        ptr,
        ptr,
        f32,
    ]
    lib.decoder_layers.restype = ctypes.c_int
    lib.first_outside.argtypes = [ptr, i64, i64, i64]
    lib.first_outside.restype = i64
    lib.ragged_rows.argtypes = [ptr, ptr, ptr, i64, ptr, i64, i64, i64, i64, i64, ptr, ptr, ptr, ptr]
    lib.ragged_rows.restype = i64
    for name in (
        "rms_norm",
        "rope_inplace",
        "kv_store",
        "argmax_rows",
        "silu_mul",
        "linear_packed",
        "pack_linear_weight",
    ):
        getattr(lib, name).restype = None
    return lib


def raise_for(rc: int) -> None:
    """The attention kernel's return code as an error (0: none)."""
    if rc != 0:
        raise RuntimeError(
            {
                1: "paged attention kernel: out of memory for its scores",
                3: "paged attention kernel: unsupported head layout",
            }.get(rc, f"kernel error {rc}")
        )
