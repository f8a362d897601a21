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
  and tables, built and range-checked in one pass (it was a Python loop over every token).
- ``decoder_layers`` (``decoder_layer.c``): every decoder layer of a ragged step and the final
  norm, the kernels above called in the model's order from C (``model/c_layers.py`` fills its arguments): the same
  bits as calling them one by one, without the Python between them.

Each wrapper checks what the C code would otherwise trust (dtypes, shapes, strides, and the index
ranges unless the caller says an earlier call checked the same indices) and answers None or False
where it cannot run, so the caller takes PyTorch's path: the same results, within float rounding.

Why this way: plain C without PyTorch headers, so the system C compiler builds the library in
about two seconds (a PyTorch C++ extension takes about a minute on two cores); it is cached per
source, compiler and CPU under ``$TINYLLM_CACHE`` (default ``~/.cache/tinyllm``), a directory that
must be this user's and not group- or world-writable (a library in it is checked the same way
before it is loaded, and against a stamp beside it holding its whole build key and sha256; one
that fails is rebuilt, and an unsafe directory leaves PyTorch running, the log saying why). Where no compiler
is found, or the build fails, ``library()`` says so once in the log (info level) and returns None,
and everything runs on PyTorch: the kernels are a speed-up, never a requirement.
``TINYLLM_NATIVE=0`` in the environment (or ``native.ENABLED = False``) turns them off.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import math
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from array import array
from pathlib import Path

import torch
from torch import Tensor

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
FLAGS = [
    "-O3",
    "-fPIC",
    "-shared",
    "-fopenmp-simd",
    "-fno-math-errno",
    "-fno-trapping-math",  # (no FP exceptions looked at: lets GCC vectorize exp's clamp)
    "-ffp-contract=fast",
]  # a*b+c fused wherever it appears (GCC's default; clang's fuses less):
# linear.c's row tiles of every height then round alike

# Read once (the hot path asks per layer); tests set it directly.
ENABLED = os.environ.get("TINYLLM_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")

_lib: ctypes.CDLL | None = None
_tried = False
_lock = threading.Lock()  # the first library() call builds; concurrent callers wait for it
why_not = ""  # why the kernels are not in use (for the bench and the log)
LOCK_NAME = ".lock"  # in the cache directory: processes building at once take turns (flock)


class UnsafeCache(RuntimeError):
    """The kernel cache (or a library in it) could be written by someone else: not used."""


def cache_dir() -> Path:
    """``$TINYLLM_CACHE/kernels``, else ``$XDG_CACHE_HOME/tinyllm/kernels``, else
    ``~/.cache/tinyllm/kernels``. Raises UnsafeCache with no home directory to put it in (never a
    shared fallback such as /tmp, where another user could plant a library)."""
    root = os.environ.get("TINYLLM_CACHE")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME")
        if not base:
            home = os.path.expanduser("~")
            if home.startswith("~"):  # no HOME and no passwd entry
                raise UnsafeCache("no home directory for the kernel cache: set TINYLLM_CACHE to a private directory")
            base = os.path.join(home, ".cache")
        root = os.path.join(base, "tinyllm")
    return Path(root) / "kernels"


def _uid() -> int:
    return os.geteuid()


def _writable_by_others(st: os.stat_result) -> str | None:
    """Why a file or directory with this stat could be changed by another user, or None."""
    if st.st_uid != _uid():
        return f"owned by uid {st.st_uid}, not this user ({_uid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'} (mode {stat.S_IMODE(st.st_mode):o})"
        )
    return None


def safe_cache_dir() -> Path:
    """The cache directory, made private (0700) if it is new; UnsafeCache if it exists but
    another user owns it or it is group- or world-writable."""
    d = cache_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    problem = _writable_by_others(d.stat())
    if problem is not None:
        raise UnsafeCache(f"the kernel cache {d} is {problem}; fix it or set TINYLLM_CACHE to a private directory")
    return d


def check_library(path: Path) -> None:
    """Refuse to load ``path`` unless it is a regular file of this user's that no one else can
    write (a library loaded runs with this process's rights). Raises UnsafeCache."""
    st = path.lstat()
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeCache(f"{path} is not a regular file")
    problem = _writable_by_others(st)
    if problem is not None:
        raise UnsafeCache(f"{path} is {problem}")


def _locked(d: Path):
    """An exclusive lock on ``d``'s lock file (processes building at once take turns); a
    context manager. Where fcntl is missing (Windows) a no-op: the build's rename stays atomic."""
    import contextlib

    try:
        import fcntl
    except ImportError:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def hold():
        fd = os.open(d / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # (releases the lock)

    return hold()


def _compiler() -> str | None:
    return next((c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)


def _torch_uses_libgomp() -> bool:
    """PyTorch's OpenMP runtime is GNU libgomp (Linux wheels): a kernel built with -fopenmp then
    shares its thread pool (same soname, already loaded). Anything else (macOS's libomp, Intel's)
    would be a second pool fighting the first for the cores: the kernel is built serial there."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    # exactly the soname -fopenmp links: a wheel bundling a renamed copy (libgomp-<hash>.so.1) would
    # leave the kernel on the system's, a second pool
    return any(line.endswith("/libgomp.so.1") for line in maps.splitlines())


def _machine_id(cc: str) -> str:
    """What the build depends on beyond the source: the compiler's version and, since it is built
    for this CPU (-march=native), the CPU's feature flags. A cache shared between machines (an NFS
    home, a container image) then never hands a CPU code built for another: that would die with
    an illegal instruction, which no Python code can catch."""
    try:
        version = subprocess.run(
            [cc, "--version"], capture_output=True, text=True, errors="replace", timeout=30
        ).stdout.split("\n")[0]
    except (OSError, subprocess.SubprocessError):
        version = "?"
    flags = ""
    try:
        flags = next(
            (
                line
                for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
                if line.startswith(("flags", "Features"))
            ),
            "",
        )
    except OSError:
        pass
    return " ".join([version, flags or platform.processor(), platform.machine(), sys.platform])


def _build(cc: str) -> Path:
    """The shared library for the sources in ``csrc``, this compiler and CPU, built unless cached. Written to a
    temporary name and renamed, so processes building at once (test workers) never load a
    half-written file. Tries -march=native and OpenMP first, then without either; a build counts
    once it loads (clang takes -fopenmp and compiles calls into its own OpenMP runtime, libomp,
    which the library then lacks: "undefined symbol: __kmpc_..." at load, where the serial build
    runs)."""
    sources = sorted(CSRC.glob("*.c"))
    src = b"".join(p.read_bytes() for p in sorted(CSRC.glob("*.[ch]")))
    openmp = ["-fopenmp"] if _torch_uses_libgomp() else []
    native = ["-march=native"] if platform.machine() in ("x86_64", "AMD64") else ["-mcpu=native"]
    # Linux: a symbol left undefined fails the link, not a later process's load (the load check
    # below passes where the building process happens to hold the runtime already)
    defs = ["-Wl,-z,defs"] if sys.platform.startswith("linux") else []
    key = hashlib.sha256(src + " ".join([cc, *FLAGS, *defs, *openmp, _machine_id(cc)]).encode())
    d = safe_cache_dir()
    out = d / f"tinyllm-{key.hexdigest()[:16]}.so"
    with _locked(d):  # another process building the same library: wait for it, then use it
        if out.exists():
            try:
                check_library(out)
                _check_stamp(out, key.hexdigest())
                return out
            except UnsafeCache as e:  # not trusted: built again in its place (the directory is ours)
                log.warning("C kernels: rebuilding %s", e)
        _compile(cc, sources, openmp, native, defs, out)
        _write_stamp(out, key.hexdigest())
        return out


def _stamp(lib: Path) -> Path:
    """The JSON beside a built library: its whole build key and its content's sha256."""
    return lib.with_name(lib.name + ".json")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_stamp(lib: Path, key: str) -> None:
    stamp = _stamp(lib)
    tmp = stamp.with_name(f"{stamp.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump({"key": key, "sha256": _sha256(lib)}, f)
    os.replace(tmp, stamp)


def _check_stamp(lib: Path, key: str) -> None:
    """The library is the build of ``key`` (its name holds only the first 16 hex digits) and
    unchanged since: its stamp (checked as the library is: ours, written by no one else) says
    so. Raises UnsafeCache."""
    stamp = _stamp(lib)
    if not stamp.exists():
        raise UnsafeCache(f"{lib} has no build stamp ({stamp.name})")
    check_library(stamp)
    try:
        got = json.loads(stamp.read_text())
    except (OSError, ValueError) as e:
        raise UnsafeCache(f"{stamp} is unreadable ({e})") from None
    if not isinstance(got, dict) or got.get("key") != key:
        raise UnsafeCache(f"{lib} was built for another build key")
    if got.get("sha256") != _sha256(lib):
        raise UnsafeCache(f"{lib} changed since it was built (its sha256 is not its stamp's)")


def _compile(cc: str, sources: list[Path], openmp: list[str], native: list[str], defs: list[str], out: Path) -> Path:
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        errors = ""
        for extra in ([*openmp, *native], openmp, native, []) if openmp else (native, []):
            r = subprocess.run(
                [cc, *FLAGS, *defs, *extra, "-I", str(CSRC), "-o", tmp, *map(str, sources), "-lm"],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=120,
            )
            if r.returncode != 0:
                errors = r.stderr.strip()[-400:]
                continue
            try:
                ctypes.CDLL(tmp)  # (a library that fails to load is not kept loaded)
            except OSError as e:
                errors = f"built with {' '.join(extra) or 'no extra flags'} but does not load: {e}"[-400:]
                continue
            os.chmod(tmp, 0o755)  # (the linker's mode follows the umask: never group-writable here)
            os.replace(tmp, out)
            return out
        raise RuntimeError(f"{cc} failed: {errors}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


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
        cc = _compiler()
        if cc is None:
            why_not = "no C compiler found (cc, gcc, clang)"
        else:
            try:
                _lib = load(_build(cc))
            except UnsafeCache as e:
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


POOL_DTYPES = (torch.float32, torch.bfloat16)  # the K/V pool element types the kernels read and write


def usable(q: Tensor, pool: Tensor) -> bool:
    """The kernel can run this attention: CPU, float32 query, a float32 or bfloat16 pool, not
    recording autograd (it has no backward)."""
    return (
        q.device.type == "cpu"
        and pool.device.type == "cpu"
        and q.dtype == torch.float32
        and pool.dtype in POOL_DTYPES
        and not (torch.is_grad_enabled() and q.requires_grad)
        and library() is not None
    )


def check_arguments(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    tables: Tensor,
    lens: Tensor,
    block_size: int,
    bounds: bool = True,
    row_table: Tensor | None = None,
) -> None:
    """Everything the C code trusts, checked here: it reads raw pointers, so a wrong dtype, shape
    or block id would read out of bounds (a crash, or silently wrong attention) instead of raising.
    ``bounds=False`` skips the lengths', block ids' and table numbers' ranges (reductions, ~30 us):
    for the layers after the first of a step, which share its tables and lens."""
    H, rows, D = q.shape
    problems = []
    if not (q.is_cpu and k.is_cpu and v.is_cpu and tables.is_cpu and lens.is_cpu):
        problems.append("every tensor on the CPU")
    if not (q.dtype == torch.float32 and k.dtype == v.dtype and k.dtype in POOL_DTYPES):
        problems.append(f"a float32 q and a float32 or bfloat16 k/v (got {q.dtype}, {k.dtype}, {v.dtype})")
    if tables.dtype != torch.int64 or lens.dtype != torch.int64:
        problems.append(f"int64 tables and lens (got {tables.dtype}, {lens.dtype})")
    if k.dim() != 3 or k.shape != v.shape or k.size(2) != D or H % k.size(1):
        problems.append(
            f"k, v of shape (tokens, Hkv, {D}) with Hkv dividing {H} (got {tuple(k.shape)}, {tuple(v.shape)})"
        )
    if not (k.is_contiguous() and v.is_contiguous() and tables.is_contiguous() and lens.is_contiguous()):
        problems.append("contiguous pool, tables and lens")
    if row_table is not None and (
        row_table.dtype != torch.int64
        or row_table.shape != (rows,)
        or not (row_table.is_cpu and row_table.is_contiguous())
    ):
        problems.append(f"a contiguous int64 row_table ({rows},) on the CPU")
    elif (
        tables.dim() != 2
        or (tables.size(0) != rows if row_table is None else rows and not tables.size(0))
        or lens.shape != (rows,)
    ):
        problems.append(f"tables ({rows if row_table is None else 'n'}, width) and lens ({rows},)")
    elif rows and bounds:
        problems += plan_range_problems(tables, lens, row_table, k.size(0) // block_size, block_size)
    if problems:
        raise ValueError(_ATTENTION_NEEDS + "; ".join(problems))


_ATTENTION_NEEDS = "paged decode attention needs "


def plan_range_problems(
    tables: Tensor, lens: Tensor, row_table: Tensor | None, n_blocks: int, block_size: int
) -> list[str]:
    """What is out of range in an attention plan (non-empty, shapes already checked): lengths
    past the tables' width, block ids past the pool, table numbers past the tables."""
    if not in_range(lens, 1, tables.size(1) * block_size):
        return [f"lens in 1..{tables.size(1) * block_size} (the table's width x block_size)"]
    if not in_range(tables, 0, n_blocks - 1):
        return [f"block ids in 0..{n_blocks - 1}"]
    if row_table is not None and not in_range(row_table, 0, tables.size(0) - 1):
        return [f"row_table entries in 0..{tables.size(0) - 1} (the tables' rows)"]
    return []


def check_range(ix: Tensor, n: int, what: str, why: str = "") -> None:
    """Every entry of ``ix`` (int64, non-empty) in 0..n-1, or a ValueError naming ``what`` (and
    ``why`` that range): the indices a kernel would write or read through without looking."""
    if not in_range(ix, 0, n - 1):
        raise ValueError(f"{what} must be in 0..{n - 1}{why}, got {int(ix.min())}..{int(ix.max())}")


def in_range(ix: Tensor, lo: int, hi: int) -> bool:
    """Every entry of ``ix`` (int64) in lo..hi: one pass in C (``ranges.c``) on a contiguous CPU
    tensor, else a PyTorch min and max."""
    lib = library()
    if lib is not None and ix.dtype == torch.int64 and ix.device.type == "cpu" and ix.is_contiguous():
        return lib.first_outside(ix.data_ptr(), ix.numel(), lo, hi) < 0
    return not ix.numel() or (int(ix.min()) >= lo and int(ix.max()) <= hi)


def decode_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    tables: Tensor,
    lens: Tensor,
    block_size: int,
    bounds_checked: bool = False,
    row_table: Tensor | None = None,
) -> Tensor:
    """Attention over a paged pool, read in place, one query token per row: a decode row, or one
    token of a prefill chunk (the chunk's tokens share their sequence's table, with lengths
    start+1 .. start+n: causal attention).

    q: (H, rows, D), last dim contiguous; k, v: one layer's pool (tokens, Hkv, D), contiguous;
    tables: (rows, width) int64 block ids, every entry a valid block (pad a short row with any, e.g.
    the pool's scratch block: entries past a row's length are never read), or (n, width) with
    ``row_table`` (rows,) int64 naming each row's table; lens: (rows,) int64, the positions each
    row attends (0 .. lens-1, through its table), each at least 1. Checked
    (``check_arguments``): a ValueError, never an out-of-bounds read. ``bounds_checked``: the
    ranges of these same tables, lens and row_table were checked by an earlier call (on a pool as large).
    Returns (H, rows, D): a view of a (rows, H, D) tensor, so the model's transpose back to
    token-major costs no copy."""
    H, rows, D = q.shape
    check_arguments(q, k, v, tables, lens, block_size, bounds=not bounds_checked, row_table=row_table)
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty(rows, H, D, dtype=q.dtype, device=q.device)
    rc = library().paged_decode_attention(
        q.data_ptr(),
        q.stride(1),
        q.stride(0),
        k.data_ptr(),
        v.data_ptr(),
        tables.data_ptr(),
        tables.size(1),
        None if row_table is None else row_table.data_ptr(),
        lens.data_ptr(),
        out.data_ptr(),
        out.stride(0),
        out.stride(1),
        rows,
        H,
        k.size(1),
        D,
        block_size,
        D**-0.5,
        torch.get_num_threads(),
        k.dtype == torch.bfloat16,
    )
    _raise_for(rc)
    return out.transpose(0, 1)


def _raise_for(rc: int) -> None:
    """The attention kernel's return code as an error (0: none)."""
    if rc != 0:
        raise RuntimeError(
            {
                1: "paged attention kernel: out of memory for its scores",
                3: "paged attention kernel: unsupported head layout",
            }.get(rc, f"kernel error {rc}")
        )


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor | None:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim, in one C pass per row; None where
    it cannot run (not CPU float32, autograd recording, no library): the caller uses PyTorch.
    Called twice per layer and step: the checks are the cheap ones (~10 us here; each reshape,
    view or device object would add microseconds to a pass that itself takes a few)."""
    lib = library()
    if (
        lib is None
        or not (x.is_cpu and weight.is_cpu)
        or x.dtype != torch.float32
        or weight.dtype != torch.float32
        or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    ):
        return None
    D = x.shape[-1]
    if D == 0 or weight.shape != (D,) or not weight.is_contiguous():
        return None
    if not x.is_contiguous():
        x = x.contiguous()
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    lib.rms_norm(x.data_ptr(), D, weight.data_ptr(), out.data_ptr(), D, x.numel() // D, D, eps)
    return out


def _plain(*ts: Tensor, dtypes: tuple[torch.dtype, ...] = (torch.float32,)) -> bool:
    """CPU tensors of ``dtypes`` (float32) autograd is not recording: what the small kernels take."""
    grad = torch.is_grad_enabled()
    return all(
        t.is_cpu
        and t.dtype in dtypes
        and not (grad and t.requires_grad)
        and t.layout == torch.strided
        and not t._is_zerotensor()
        for t in ts
    )  # real memory to read


def rope_(heads: Tensor, pos: Tensor, cos: Tensor, sin: Tensor, n_rotated: int, bounds_checked: bool = False) -> bool:
    """The rotary embedding, in place, on the first ``n_rotated`` heads of each token of ``heads``
    (B, T, heads, D), head dim contiguous (the fused qkv projection's output viewed by head: q and
    k rotate, v does not); ``pos`` (B, T) int64 rows of the (max_len, D) tables ``cos``/``sin``.
    False where it cannot run (the caller rotates with PyTorch). ``bounds_checked``: these
    positions were range-checked already (they are the same for every layer of a forward)."""
    lib = library()
    if lib is None or heads.dim() != 4 or not _plain(heads, cos, sin):
        return False
    B, T, n_heads, D = heads.shape
    if pos.dim() == 2 and not pos.is_contiguous():  # e.g. arange(T).expand(B, T)
        pos = pos.contiguous()
    if (
        D % 2
        or not 0 <= n_rotated <= n_heads
        or heads.stride(3) != 1
        or heads.stride(2) != D
        or heads.stride(0) != T * heads.stride(1)
        or (B * T > 1 and heads.stride(1) < n_heads * D)
        or pos.shape != (B, T)
        or pos.dtype != torch.int64
        or not (pos.is_cpu and pos.is_contiguous() and cos.is_contiguous() and sin.is_contiguous())
        or cos.dim() != 2
        or cos.shape != sin.shape
        or cos.size(1) != D
    ):
        return False
    if not bounds_checked and pos.numel():
        check_range(pos, cos.size(0), "rotary positions", " (max_seq_len)")
    lib.rope_inplace(
        heads.data_ptr(), heads.stride(1), B * T, n_rotated, D, pos.data_ptr(), cos.data_ptr(), sin.data_ptr()
    )
    return True


def kv_store(k: Tensor, v: Tensor, write: Tensor, k_pool: Tensor, v_pool: Tensor, bounds_checked: bool = False) -> bool:
    """``k_pool[write] = k`` and ``v_pool[write] = v`` in one call: k, v (T, Hkv, D) float32 with each
    token's (Hkv, D) contiguous and the same strides; pools (rows, Hkv, D) contiguous, float32 or
    bfloat16 (rounded as ``.to(torch.bfloat16)`` rounds); write (T,) int64 pool rows. False where it
    cannot run (the caller copies with PyTorch). ``bounds_checked``: these write rows were
    range-checked against a pool as large already (every layer of a step shares them)."""
    lib = library()
    if (
        lib is None
        or not _plain(k, v)
        or not _plain(k_pool, v_pool, dtypes=POOL_DTYPES)
        or v_pool.dtype != k_pool.dtype
    ):
        return False
    T = k.size(0)
    if (
        k.dim() != 3
        or k.shape != v.shape
        or k.stride() != v.stride()
        or k.shape[1:] != k_pool.shape[1:]
        or k_pool.shape != v_pool.shape
        or not (k_pool.is_contiguous() and v_pool.is_contiguous())
        or k.stride(2) != 1
        or k.stride(1) != k.size(2)
        or write.shape != (T,)
        or write.dtype != torch.int64
        or not (write.is_cpu and write.is_contiguous())
    ):
        return False
    if not bounds_checked and T:
        check_range(write, k_pool.size(0), "KV write rows")
    lib.kv_store(
        k.data_ptr(),
        v.data_ptr(),
        k.stride(0),
        T,
        k.size(1) * k.size(2),
        write.data_ptr(),
        k_pool.data_ptr(),
        v_pool.data_ptr(),
        k_pool.dtype == torch.bfloat16,
    )
    return True


def argmax(x: Tensor) -> Tensor | None:
    """Each row's argmax, (rows, 1) int64, as ``x.argmax(dim=-1, keepdim=True)`` (first index of
    the largest value; of the first NaN where there is one); None where it cannot run."""
    lib = library()
    if lib is None or x.dim() != 2 or x.size(1) == 0 or not _plain(x) or x.stride(1) != 1:
        return None
    out = torch.empty(x.size(0), 1, dtype=torch.int64)
    lib.argmax_rows(x.data_ptr(), x.stride(0), x.size(0), x.size(1), out.data_ptr())
    return out


def ragged_rows(
    items: list[tuple[int, int, int]], tables: Tensor, block_size: int, n_blocks: int, total: int
) -> Tensor | None:
    """A ragged step's rows (``ragged_rows.c``): ``items`` (slot, start, n), ``total`` their n's
    sum, ``tables`` (slots, width) int64 block ids, each slot's table in its row (past its end:
    any id outside 0..n_blocks-1), over a pool of ``n_blocks`` blocks. (4, total) int64: each
    token's position, pool row to write, length to attend (position + 1) and table (its slot);
    None where the library cannot run. Range-checked as it is built (every block id a token reads
    or writes is in the pool): a ValueError names what is wrong, so the kernels may trust what
    it returns."""
    lib = library()
    if (
        lib is None
        or not items
        or tables.dtype != torch.int64
        or tables.dim() != 2
        or not tables.is_cpu
        or not tables.is_contiguous()
    ):
        return None
    if block_size < 1 or n_blocks < 1 or tables.size(1) * block_size >= 2**62:
        raise ValueError(
            f"ragged rows need block_size >= 1 and n_blocks >= 1 (tables of width {tables.size(1)}), "
            f"got {block_size} and {n_blocks}"
        )
    slots, starts, ns = (array("q", column) for column in zip(*items))
    out = torch.empty(4, total, dtype=torch.int64)
    at = out.data_ptr()
    bad = lib.ragged_rows(
        slots.buffer_info()[0],
        starts.buffer_info()[0],
        ns.buffer_info()[0],
        len(items),
        tables.data_ptr(),
        tables.size(0),
        tables.size(1),
        block_size,
        n_blocks,
        total,
        at,
        at + 8 * total,
        at + 16 * total,
        at + 24 * total,
    )
    if bad > len(items):
        raise ValueError(f"ragged items hold {sum(ns)} tokens, not the {total} given")
    if bad:
        i = abs(bad) - 1
        slot, start, n = items[i]
        if bad < 0:
            raise ValueError(
                f"ragged item {i} (slot {slot}, positions {start}..{start + n - 1}): its block table "
                f"does not hold one of the pool's blocks (0..{n_blocks - 1}) for each of positions "
                f"0..{start + n - 1}: {tables[slot].tolist()}"
            )
        raise ValueError(
            f"ragged item {i} (slot {slot}, positions {start}..{start + n - 1}) is outside the block "
            f"tables: slots 0..{tables.size(0) - 1}, positions 0..{tables.size(1) * block_size - 1}, "
            f"at least one token"
        )
    return out


def silu_mul(gate_up: Tensor) -> Tensor | None:
    """silu(gate) * up from (..., 2F) holding gate then up (the fused projection's output):
    (..., F), one pass; None where it cannot run."""
    lib = library()
    if lib is None or gate_up.dim() < 1 or gate_up.size(-1) % 2 or not _plain(gate_up):
        return None
    if not gate_up.is_contiguous():
        gate_up = gate_up.contiguous()
    F = gate_up.size(-1) // 2
    out = torch.empty(*gate_up.shape[:-1], F, dtype=torch.float32)
    if F:
        lib.silu_mul(gate_up.data_ptr(), 2 * F, gate_up.numel() // (2 * F), F, out.data_ptr())
    return out


PANEL = 16  # output columns per packed panel (linear.c's NR)


def pack_linear(w: Tensor) -> Tensor | None:
    """W (N, K), as nn.Linear holds it, in ``linear``'s layout: ceil(N/16) panels of (K, 16), zero
    past N. None where the kernels cannot run (the caller keeps its other path)."""
    lib = library()
    if lib is None or w.dim() != 2 or not _plain(w):
        return None
    w = w.detach().contiguous()
    N, K = w.shape
    packed = torch.empty(-(-N // PANEL), K, PANEL, dtype=torch.float32)
    lib.pack_linear_weight(w.data_ptr(), N, K, packed.data_ptr())
    return packed


def linear(x: Tensor, packed: Tensor, n_out: int, add: Tensor | None = None) -> Tensor | None:
    """x (..., K) times the packed weight's transpose: (..., n_out), plus ``add`` (..., n_out) when
    given (a residual, added after the sum: the bits of adding it afterwards). Each output is a sum
    over k in order, so a row's result does not depend on the other rows of the call. None where it
    cannot run (not CPU float32, autograd recording, no library, shapes that do not match the
    packed weight)."""
    lib = library()
    if lib is None or x.dim() < 1 or not _plain(x, packed):
        return None
    K = x.size(-1)
    if (
        packed.dim() != 3
        or packed.shape != (-(-n_out // PANEL), K, PANEL)
        or not packed.is_contiguous()
        or (add is not None and (add.shape != (*x.shape[:-1], n_out) or not _plain(add)))
    ):
        return None
    if not x.is_contiguous():
        x = x.contiguous()
    if add is not None and not add.is_contiguous():
        add = add.contiguous()
    M = math.prod(x.shape[:-1])
    out = torch.empty(*x.shape[:-1], n_out, dtype=torch.float32)
    if M and n_out:
        lib.linear_packed(
            x.data_ptr(),
            K,
            M,
            K,
            packed.data_ptr(),
            n_out,
            out.data_ptr(),
            n_out,
            None if add is None else add.data_ptr(),
            n_out,
            torch.get_num_threads(),
        )
    return out


def decoder_layers(weights: ctypes.Array, step: LayerStep, x: Tensor, norm: Tensor, eps: float) -> Tensor:
    """Every layer (``weights``: an array of LayerWeights) over x (tokens, d) float32 contiguous,
    then the final RMSNorm (``norm``, ``eps``), in one C call: a new tensor like x (x is only
    read). It trusts every pointer and size in ``weights`` and ``step``: ``model/c_layers.py``
    fills them from tensors it has checked (the one caller)."""
    a, b = torch.empty_like(x), torch.empty_like(x)  # the layers take turns writing these
    _raise_for(
        library().decoder_layers(
            weights, len(weights), ctypes.byref(step), x.data_ptr(), a.data_ptr(), b.data_ptr(), norm.data_ptr(), eps
        )
    )
    return b if len(weights) % 2 else a
