"""Prepacked weights: on CPU, a dense weight packed once for decode-sized batches (`PackedFormat`).

A dense GEMM with few rows spends much of its time repacking the weight on every call; packing it once avoids that.
- float32: MKL's packed GEMM only accepts exactly the row count a weight was packed for, so each packed row count
  costs one more copy of the weights, and a batch slightly smaller than a packed count is padded up to it.
- bfloat16: one oneDNN copy (AMX or AVX-512 BF16 kernels), packed for the largest row count given, serves every
  batch up to `ONEDNN_MAX_ROWS` rows with the same numbers as the dense GEMM.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from tandem_server.layers.gemm import GemmModule
from tandem_server.quant.format import DenseFormat, WeightFormat

# A batch is padded to a packed row count only when at least this share of the rows is real: below it the padding
# costs more than packing saves (measured: 20 of 32 rows runs no faster than dense).
MIN_FILLED_SHARE = 0.75
# The embedded model's GEMMs with weights read from DRAM, 2 cores: the oneDNN copy is 1.4-1.5x faster than dense
# bfloat16 at 16-128 rows and 1.2x at 256, but 1.16x slower at 512, where prefill chunks stay on the dense weight.
ONEDNN_MAX_ROWS = 256


# The packed GEMMs as operators of Tandem's own, opaque to torch.compile: Inductor lowers torch's packed GEMMs only
# with the packed weight as a constant of the graph, never as an input (which the weights of compiled layers are), so
# a compiled graph calls these as they are. Eager steps call torch's operators directly: the wrapper's dispatch costs
# a few microseconds a GEMM.
@torch.library.custom_op("tandem::mkl_packed_linear", mutates_args=())
def mkl_packed_linear(
    x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed_rows: int
) -> torch.Tensor:
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, packed_rows)


@mkl_packed_linear.register_fake
def _(
    x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed_rows: int
) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.custom_op("tandem::onednn_packed_linear", mutates_args=())
def onednn_packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@onednn_packed_linear.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((x.shape[0], packed.shape[0]))


class PackedGemm(Protocol):
    """Prepacked copies of one `[out, in]` weight and the row counts they serve."""

    @property
    def nbytes(self) -> int: ...

    def fitting_rows(self, rows: int) -> int | None:
        """The packed row count a GEMM with `rows` rows runs at, or None to run it dense."""

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None, packed_rows: int) -> torch.Tensor: ...


class PackedWeight:
    """MKL-packed float32 copies of one `[out, in]` weight, one per row count in `row_counts`."""

    @staticmethod
    def unavailable_reason() -> str | None:
        if not torch.backends.mkl.is_available() or not hasattr(torch.ops.mkl, "_mkl_linear"):
            return "this torch build has no MKL"
        return None

    @staticmethod
    def summary(row_counts: tuple[int, ...]) -> str:
        return f"MKL float32 copies for {','.join(map(str, row_counts))}-row batches"

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
        gemm = mkl_packed_linear if torch.compiler.is_compiling() else torch.ops.mkl._mkl_linear
        out = gemm(x, self.copies[packed_rows], self.weight, bias, packed_rows)
        return out[:rows]


class OneDnnPackedWeight:
    """One oneDNN-packed bfloat16 copy of an `[out, in]` weight, for any batch of up to `ONEDNN_MAX_ROWS` rows."""

    @staticmethod
    def unavailable_reason() -> str | None:
        if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
            return "this CPU or torch build has no oneDNN bfloat16 kernels"
        return None

    @staticmethod
    def summary(row_counts: tuple[int, ...]) -> str:
        return f"one oneDNN bfloat16 copy for batches of up to {ONEDNN_MAX_ROWS} rows"

    def __init__(self, weight: torch.Tensor, row_counts: tuple[int, ...]) -> None:
        self.copy = torch.ops.mkldnn._reorder_linear_weight(weight, max(row_counts))
        self.nbytes = weight.numel() * weight.element_size()

    def fitting_rows(self, rows: int) -> int | None:
        return rows if rows <= ONEDNN_MAX_ROWS else None

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None, packed_rows: int) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return onednn_packed_linear(x, self.copy, bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.copy, bias, "none", [], "")


# How a CPU weight of each dtype is packed; other dtypes stay dense.
PACKING_BY_DTYPE: dict[torch.dtype, type[PackedWeight] | type[OneDnnPackedWeight]] = {
    torch.float32: PackedWeight,
    torch.bfloat16: OneDnnPackedWeight,
}


def packing_available(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when prepacked GEMMs can run here, else why not."""
    packing = PACKING_BY_DTYPE.get(dtype)
    if device.type != "cpu" or packing is None:
        return "prepacked GEMMs are a CPU float32 or bfloat16 path"
    return packing.unavailable_reason()


def packing_summary(dtype: torch.dtype, row_counts: tuple[int, ...]) -> str:
    """What packing for `row_counts` builds in `dtype`, for the start-up log."""
    return PACKING_BY_DTYPE[dtype].summary(row_counts)


class PackedFormat:
    """A dense weight with prepacked copies: a GEMM whose rows a copy fits multiplies by it, any other by `dense`."""

    quantized = None

    def __init__(self, packed: PackedGemm, dense: WeightFormat) -> None:
        self.packed = packed
        self.dense = dense

    @property
    def name(self) -> str:
        return f"{self.dense.name}, packed"

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        packed_rows = self.packed.fitting_rows(x.shape[0])
        if packed_rows is None:
            return self.dense.linear(x, bias)
        return self.packed.linear(x, bias, packed_rows)


def pack_gemm_weights(model: nn.Module, row_counts: tuple[int, ...]) -> int:
    """Packs every dense GEMM weight of `model` for `row_counts` in the way its dtype allows; returns the bytes
    added. A quantized layer has no float weight to pack."""
    added = 0
    for module in model.modules():
        if isinstance(module, GemmModule) and isinstance(module.weight_format, DenseFormat):
            packed = PACKING_BY_DTYPE[module.weight.dtype](module.weight, row_counts)
            module.use_format(PackedFormat(packed, module.weight_format))
            added += packed.nbytes
    return added
