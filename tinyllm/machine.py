"""This machine's CPU, in words: for the figures that belong to one machine (a benchmark's
report, a cost profile's cache key, the test suite's summary), so a reader can tell which
machine made them."""

import os
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def cpuinfo(*keys: str) -> str:
    """The value of the first ``/proc/cpuinfo`` line whose key is one of ``keys`` ("" where there
    is no such file or line: macOS, Windows, some containers)."""
    try:
        text = CPUINFO.read_text(errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in keys:
            return " ".join(value.split())  # (older Intel names pad with runs of spaces)
    return ""


def cpu_name() -> str:
    """The CPU's model name ("AMD EPYC 7B13"), else what ``platform`` knows ("x86_64")."""
    return cpuinfo("model name") or platform.processor() or platform.machine()


def cpus() -> int:
    """The logical CPUs this process may run on: its affinity mask (a cpuset's, where a container
    has one; a CPU quota such as docker --cpus does not show here)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def describe() -> str:
    """One line: "AMD EPYC 7B13, 2 CPUs (AVX2)" — the vector width matters to the C kernels."""
    flags = cpuinfo("flags", "Features").split()
    isa = next(
        (name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("asimd", "NEON")) if flag in flags), ""
    )
    return f"{cpu_name()}, {cpus()} CPUs" + (f" ({isa})" if isa else "")
