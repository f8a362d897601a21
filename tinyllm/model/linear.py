"""The model's linear layers: ``nn.Linear``, plus a CPU inference path on a weight packed once.

A CPU matmul with few rows (a decode step's 1-64) spends much of its time reading the weight in
a layout the kernel did not choose, and, through PyTorch's library calls, in fixed costs. So on
CPU in float32 without autograd the layer copies its weight once into panels and multiplies
from them in C (``tinyllm/csrc/linear.c`` through ``native.linear``): ~5 us a call where
oneDNN's packed linear takes ~50 us before any arithmetic, 2-5x faster at 1-16 rows and
1.0-1.4x at 64-256 (docs/benchmarks.md), and each output a plain sum over k in order, so a row gets
the same bits in any batch (greedy == solo). Without a C compiler it packs for oneDNN instead
(``mkldnn._reorder_linear_weight`` / ``_linear_pointwise``, what PyTorch's compiler does for
frozen CPU models); without oneDNN it is ``F.linear``. Results are within ~3e-6 of ``F.linear``.

The packed copy is made lazily, at the first forward without autograd on CPU in float32, and is
remade whenever the weight changes: a new tensor, new storage under the same tensor (``.to()``,
``.half().float()`` assign ``.data``; the layer holds the storage it packed from, so its address
cannot be reused unnoticed), or an in-place update of the parameter (its version counter). Not
seen: an in-place edit through ``weight.data`` (which has a version counter of its own): nothing
here does that after a forward. Grad mode on (training), autocast, CUDA, a bias (none in Llama)
and inference-mode weights use ``F.linear`` as before. The copy is a plain attribute, never in the
state dict.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinyllm import native

PACK_ROWS = 64  # the row count oneDNN picks its layout for (the default max_num_seqs); any count runs
_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_pack(w: Tensor) -> Tensor:
    """W copied into oneDNN's own blocked layout (the path without a C compiler)."""
    return torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_ROWS)


def onednn_linear(x: Tensor, packed: Tensor, add: Tensor | None = None) -> Tensor:
    """x times a weight from ``onednn_pack`` (transposed), plus ``add`` when given."""
    y = torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, None, "none", [], "")
    return y if add is None else add + y


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) that multiplies from a packed copy of its
    weight when it can (see the module docstring). ``forward(x, add)`` returns ``x W^T + add``:
    the C path adds the residual as it writes, with the bits of adding it afterwards."""

    _packed: Tensor | None = None
    _packed_by: str | None = None  # "c" (native.linear) or "onednn"
    _packed_of: tuple[int, int, int] | None = None  # (id, version, data_ptr) of the weight packed
    _packed_src: Tensor | None = None  # the storage packed from, held: its address stays unique

    def forward(self, x: Tensor, add: Tensor | None = None) -> Tensor:
        if x.device.type != "cpu" or x.dtype != torch.float32 or not self._packable():
            return self._plain(x, add)
        if self._packed_by == "c":  # the packed weight's rows: a replaced weight may
            y = native.linear(x, self._packed, self._packed_src.size(0), add)  # disagree with out_features
            if y is not None:
                return y
        elif self._packed_by == "onednn":
            return onednn_linear(x, self._packed, add)
        return self._plain(x, add)

    def c_packed(self) -> tuple[Tensor, int] | None:
        """The weight packed for ``native.linear`` (repacked first if it changed) and its output
        width, for a CPU float32 input without autograd; None where the layer would run another
        path (``model/c_layers.py`` runs whole decoder layers from these)."""
        if not self._packable() or self._packed_by != "c":
            return None
        return self._packed, self._packed_src.size(0)

    def _packable(self) -> bool:
        """A packed copy applies (CPU float32 weight, no bias, no autograd or autocast): made or
        remade here if the weight changed since the last."""
        w = self.weight
        if (
            self.bias is not None
            or torch.is_grad_enabled()
            or w.device.type != "cpu"
            or w.dtype != torch.float32
            or torch.is_autocast_enabled("cpu")
            or w.is_inference()
        ):
            return False
        key = (id(w), w._version, w.data_ptr())
        if self._packed_of != key:
            self._pack(w, key)
        return True

    def _plain(self, x: Tensor, add: Tensor | None) -> Tensor:
        y = F.linear(x, self.weight, self.bias)
        return y if add is None else add + y

    def _pack(self, w: Tensor, key: tuple[int, int, int]) -> None:
        self._packed_src = w.detach()
        self._packed, self._packed_by = native.pack_linear(self._packed_src), "c"
        if self._packed is None and _ONEDNN:
            self._packed = onednn_pack(self._packed_src)
            self._packed_by = "onednn"
        elif self._packed is None:
            self._packed_by = None
        self._packed_of = key
