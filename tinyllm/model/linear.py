"""The model's linear layers: ``nn.Linear``, plus a CPU inference path on weights prepacked for oneDNN.

A CPU matmul with few rows (a decode step's 16-64) spends much of its time reading the weight
in a layout the kernel did not choose. oneDNN can copy the weight once into its own blocked
layout (``mkldnn._reorder_linear_weight``) and multiply from that (``mkldnn._linear_pointwise``),
what PyTorch's compiler does for frozen CPU models. Measured here (docs/speed.md): 6-17% off a
decode step of the bundled model, results within ~2e-6 of ``F.linear``.

The packed copy is made lazily, at the first forward without autograd on CPU in float32, and is
remade whenever the weight changes: a new tensor, new storage under the same tensor (``.to()``,
``.half().float()`` assign ``.data``; the layer holds the storage it packed from, so its address
cannot be reused unnoticed), or an in-place update of the parameter (its version counter). Not
seen: an in-place edit through ``weight.data`` (which has a version counter of its own): nothing
here does that after a forward. Training, autocast, CUDA, inference-mode weights and builds
without oneDNN use ``F.linear`` as before. The copy is a plain attribute, never in the state dict.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

PACK_ROWS = 64          # the row count oneDNN picks its layout for (the default max_num_seqs); any count runs
_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) that multiplies from a oneDNN-packed copy
    of its weight when it can (see the module docstring)."""

    _packed: Tensor | None = None
    _packed_of: tuple[int, int, int] | None = None      # (id, version, data_ptr) of the weight packed
    _packed_src: Tensor | None = None                   # the storage packed from, held: its address stays unique

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight
        if (not _ONEDNN or self.bias is not None or torch.is_grad_enabled() or x.device.type != "cpu"
                or x.dtype != torch.float32 or w.dtype != torch.float32 or torch.is_autocast_enabled("cpu")
                or w.is_inference()):
            return F.linear(x, w, self.bias)
        key = (id(w), w._version, w.data_ptr())
        if self._packed_of != key:
            self._packed_src = w.detach()
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self._packed_src, PACK_ROWS)
            self._packed_of = key
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self._packed, None, "none", [], "")
