"""Weight GEMMs: torch's dense GEMM, or on CPU in float32 MKL's prepacked weights for decode-sized batches.

A dense float32 GEMM with few rows spends much of its time repacking the weight on every call; MKL can pack it
once. torch's packed GEMM only accepts exactly the row count a weight was packed for, so each packed row count
costs one more copy of the weights, and a batch slightly smaller than a packed count is padded up to it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# A batch is padded to a packed row count only when at least this share of the rows is real: below it the padding
# costs more than packing saves (measured: 20 of 32 rows runs no faster than dense).
MIN_FILLED_SHARE = 0.75


def packing_available(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when prepacked GEMMs can run here, else why not."""
    if device.type != "cpu" or dtype != torch.float32:
        return "prepacked GEMMs are a CPU float32 path"
    if not torch.backends.mkl.is_available() or not hasattr(torch.ops.mkl, "_mkl_linear"):
        return "this torch build has no MKL"
    return None


class PackedWeight:
    """MKL-packed copies of one `[out, in]` weight, one per row count in `row_counts`."""

    def __init__(self, weight: torch.Tensor, row_counts: tuple[int, ...]) -> None:
        self.weight = weight
        self.copies = {rows: torch.ops.mkl._mkl_reorder_linear_weight(weight, rows) for rows in sorted(row_counts)}

    @property
    def nbytes(self) -> int:
        return sum(copy.numel() * copy.element_size() for copy in self.copies.values())

    def fitting_rows(self, rows: int) -> int | None:
        """The smallest packed row count that holds `rows` with little enough padding, if any."""
        for packed_rows in self.copies:
            if packed_rows >= rows:
                return packed_rows if rows >= MIN_FILLED_SHARE * packed_rows else None
        return None

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None, packed_rows: int) -> torch.Tensor:
        rows = x.shape[0]
        if rows < packed_rows:
            x = torch.cat([x, x.new_zeros(packed_rows - rows, x.shape[1])])
        out = torch.ops.mkl._mkl_linear(x, self.copies[packed_rows], self.weight, bias, packed_rows)
        return out[:rows]


class GemmModule(nn.Module):
    """A module whose forward multiplies by `self.weight`; `pack` gives it prepacked copies for some row counts."""

    weight: torch.Tensor
    packed: PackedWeight | None = None

    def pack(self, row_counts: tuple[int, ...]) -> int:
        """Packs the weight for `row_counts`; returns the bytes the copies take."""
        self.packed = PackedWeight(self.weight, row_counts)
        return self.packed.nbytes

    def gemm(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """`x @ weight.T + bias` for 2-D `x`, through a packed copy when one fits the row count."""
        if self.packed is not None:
            packed_rows = self.packed.fitting_rows(x.shape[0])
            if packed_rows is not None:
                return self.packed.linear(x, bias, packed_rows)
        return F.linear(x, self.weight, bias)


def pack_gemm_weights(model: nn.Module, row_counts: tuple[int, ...]) -> int:
    """Packs every GEMM weight of `model` for `row_counts`; returns the bytes added."""
    return sum(module.pack(row_counts) for module in model.modules() if isinstance(module, GemmModule))
