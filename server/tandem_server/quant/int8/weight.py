"""int8 weights for torch's CPU weight-only kernel (`torch._weight_int8pack_mm`): `w = q * scale` per output channel,
q in -127..127, scale in bfloat16; and GGUF's Q8_0 (a scale per group of 32 inputs) as two int4 weights.

The kernel reads 1 byte per weight instead of 4; it is fast only with bfloat16 activations, so each GEMM casts its
input to bfloat16 and its output back to the model's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tandem_server.quant.int4.weight import ACTIVATION_DTYPE, Int4Weight
from tandem_server.quant.values import Int8Channels, Int8Groups, tensor_bytes


class Int8GroupsWeight:
    """An int8 weight with a scale per group of 32 inputs (GGUF's Q8_0), exactly: two int4 weights, its high and
    low nibbles, multiplied and summed (torch's int8 kernel takes one scale per output channel only)."""

    name = "int8 in groups of 32"

    def __init__(self, groups: Int8Groups) -> None:
        high, low = groups.nibble_planes()
        self.high, self.low = Int4Weight(high), Int4Weight(low)
        self.out_features, self.in_features = groups.q.shape
        self.nbytes = self.high.nbytes + self.low.nbytes

    @property
    def quantized(self) -> Int8GroupsWeight:
        return self

    @property
    def serves_rows(self) -> bool:
        return self.high.unpackable

    def dense_values(self) -> torch.Tensor | None:
        """The float32 `[out, in]` values both planes multiply by together; None when this CPU's int4 packing cannot
        be read back."""
        if not self.high.unpackable:
            return None
        return self.high.dequantize() + self.low.dequantize()

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = self.high.linear(x, None) + self.low.linear(x, None)
        return out if bias is None else out + bias

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return (self.high.rows(ids, torch.float32) + self.low.rows(ids, torch.float32)).to(dtype)


class Int8Weight:
    """An int8 per-channel weight for `torch._weight_int8pack_mm`; also serves embedding lookups of its rows."""

    name = "int8"
    serves_rows = True

    def __init__(self, channels: Int8Channels) -> None:
        self.out_features, self.in_features = channels.q.shape
        self.q = channels.q.contiguous()
        self.scale = channels.scale.float()
        self.kernel_scale = channels.scale.to(ACTIVATION_DTYPE)
        self.nbytes = tensor_bytes(self.q) + tensor_bytes(self.scale) + tensor_bytes(self.kernel_scale)

    @property
    def quantized(self) -> Int8Weight:
        return self

    def dense_values(self) -> torch.Tensor:
        """The float32 `[out, in]` values the kernel multiplies by."""
        return self.q.float() * self.scale.unsqueeze(-1)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = torch._weight_int8pack_mm(x.to(ACTIVATION_DTYPE), self.q, self.kernel_scale).to(x.dtype)
        return out if bias is None else out + bias

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Dequantized rows `ids` (an embedding lookup)."""
        return (F.embedding(ids, self.q).float() * F.embedding(ids, self.scale.unsqueeze(-1))).to(dtype)
