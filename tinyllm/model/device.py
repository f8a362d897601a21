"""The one place that picks cpu or cuda from what the user asked for, and the precision used there."""

from __future__ import annotations

from contextlib import nullcontext

import torch


def resolve_device(requested: str | None) -> str:
    """``None`` → cuda when available, else cpu. Raises ValueError for an unknown device or
    cuda on a machine without one (message meant for the user)."""
    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested not in ("cpu", "cuda") and not requested.startswith("cuda:"):
        raise ValueError(f"--device must be cpu or cuda, got {requested!r}")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available on this machine")
    return requested


def autocast(device: torch.device):
    """bf16 autocast on CUDA; full precision elsewhere (CPU bf16 is slower, not faster): there an
    autocast a caller turned on is turned off, and where none is on nothing is entered (an
    autocast context costs ~10 us, paid per forward)."""
    if device.type == "cuda" or torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    return nullcontext()
