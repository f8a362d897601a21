"""Building the kernel library safely: compiled by the system C compiler, cached, and trusted
only where no one else could have changed it.

Plain C without PyTorch headers, so the system C compiler builds the library in about two seconds
(a PyTorch C++ extension takes about a minute on two cores). It is cached per source, compiler and
CPU under ``$TINYLLM_CACHE`` (default ``~/.cache/tinyllm``), a directory that must be this user's
and not group- or world-writable; a library in it is checked the same way before it is loaded,
and against a stamp beside it holding its whole build key and sha256. One that fails is rebuilt;
an unsafe directory raises ``UnsafeCache`` (PyTorch runs, the log saying why).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from tinyllm.machine import cpuinfo

log = logging.getLogger(__name__)

CSRC = Path(__file__).parent.parent / "csrc"
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


def compiler() -> str | None:
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
    flags = cpuinfo("flags", "Features")
    return " ".join([version, flags or platform.processor(), platform.machine(), sys.platform])


def built_library(cc: str) -> Path:
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
