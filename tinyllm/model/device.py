"""The one place that picks cpu or cuda from what the user asked for, and the precision used there."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch

from tinyllm.config import is_device_name


def resolve_device(requested: str | None) -> str:
    """``None`` → cuda when available, else cpu. Raises ValueError for an unknown device or
    cuda on a machine without one (message meant for the user)."""
    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not is_device_name(requested):
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {requested!r}")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available on this machine")
    return requested


def is_cuda(device: torch.device | str) -> bool:
    """Whether ``device`` is a CUDA device, indexed or not: compare the type, never the string,
    or "cuda:0" reads as not CUDA."""
    return torch.device(device).type == "cuda"


_cuda_bf16 = True  # bf16 autocast on CUDA; full_precision() turns it off for a while


@contextmanager
def full_precision() -> Iterator[None]:
    """float32 on CUDA too while inside (no bf16 autocast). bf16 rounds differently for each
    kernel shape, so two CUDA paths (graph vs eager, batched vs solo) may part on near-ties; at
    float32 only summation order differs, and greedy tokens must agree. Process-wide: meant for
    checks and tests, not for a server. A CUDA graph keeps the precision it was captured in."""
    global _cuda_bf16
    before, _cuda_bf16 = _cuda_bf16, False
    try:
        yield
    finally:
        _cuda_bf16 = before


def autocast(device: torch.device):
    """bf16 autocast on CUDA (unless inside ``full_precision``); full precision elsewhere (CPU
    bf16 is slower, not faster): there an autocast a caller turned on is turned off, and where
    none is on nothing is entered (an autocast context costs ~10 us, paid per forward)."""
    bf16 = device.type == "cuda" and _cuda_bf16
    if bf16 or torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
    return nullcontext()
