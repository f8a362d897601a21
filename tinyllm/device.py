"""The one place that picks cpu or cuda from what the user asked for."""

from __future__ import annotations


def resolve_device(requested: str | None) -> str:
    """``None`` → cuda when available, else cpu. Raises ValueError for an unknown device or
    cuda on a machine without one (message meant for the user)."""
    import torch
    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested not in ("cpu", "cuda") and not requested.startswith("cuda:"):
        raise ValueError(f"--device must be cpu or cuda, got {requested!r}")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available on this machine")
    return requested
