"""What a linear layer multiplies by: exactly one `WeightFormat` per layer.

A dense float weight, a prepacked one (`packed.py`), a quantized one (`int4/`, `int8/`, `fp8/`) and a quantized one
with a bfloat16 copy for batches (`dense_copies.py`) are each a format; a format that serves some row counts with
another format holds that one. Preparing the weights (`pipeline.py`) replaces a layer's format, never adds a slot to
the layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from tandem_server.quant.kernels import QuantizedWeight


class WeightFormat(Protocol):
    """How one linear layer holds its `[out, in]` weight and multiplies an input by it."""

    @property
    def name(self) -> str:
        """What the weight is stored as, for Info and the start-up log (`float32`, `int4`, ...)."""
        ...

    @property
    def nbytes(self) -> int:
        """Bytes the format holds beyond the layer's parameters (a dense format holds none of its own)."""
        ...

    @property
    def quantized(self) -> QuantizedWeight | None:
        """The quantized weight the format multiplies small batches by, if any (a tied embedding looks up its rows)."""
        ...

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """`x @ weight.T + bias` for 2-D `x`."""
        ...


class HasWeight(Protocol):
    weight: torch.Tensor


class DenseFormat:
    """The layer's own float weight through torch's dense GEMM.

    It reads the layer's `weight` at every call rather than keeping the tensor: loading may still give a stacked
    weight new storage (`meta_storage`) after the format is made.
    """

    nbytes = 0
    quantized = None

    def __init__(self, layer: HasWeight) -> None:
        self.layer = layer

    @property
    def name(self) -> str:
        return str(self.layer.weight.dtype).removeprefix("torch.")

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, self.layer.weight, bias)
