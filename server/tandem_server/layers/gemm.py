"""The base of every linear layer that multiplies by a weight matrix: its one `WeightFormat` does the GEMM."""

from __future__ import annotations

import torch
from torch import nn

from tandem_server.quant.format import DenseFormat, WeightFormat
from tandem_server.quant.kernels import QuantizedWeight


class GemmModule(nn.Module):
    """A module whose forward multiplies by its weight through `weight_format`: dense (`weight` itself) until the
    weights are prepared (`quant/pipeline.py`), which may swap in another format."""

    weight: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.weight_format: WeightFormat = DenseFormat(self)

    def weight_parts(self) -> list[torch.Tensor]:
        """The parameters whose rows make up `weight`, in order (one, unless layers are stacked)."""
        return [self.weight]

    def use_format(self, weight_format: WeightFormat) -> None:
        """Multiplies by `weight_format` from now on."""
        self.weight_format = weight_format

    def use_quantized(self, quantized: QuantizedWeight) -> None:
        """Multiplies by `quantized` from now on and releases the float weight's memory."""
        self.use_format(quantized)
        for tensor in [*self.weight_parts(), self.weight]:
            release_storage(tensor)

    def gemm(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """`x @ weight.T + bias` for 2-D `x`."""
        return self.weight_format.linear(x, bias)


def release_storage(tensor: torch.Tensor) -> None:
    """Empties `tensor` in place, freeing its memory; one on meta has none, and an empty view of it will do (torch
    refuses a new meta tensor made under inference mode as the data of one made outside it)."""
    tensor.data = tensor.data[:0] if tensor.is_meta else tensor.data.new_empty(0)
