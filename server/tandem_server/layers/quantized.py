"""Weight-only quantized GEMMs on CPU: int4 groupwise and int8 per-channel weights, bfloat16 activations.

torch's CPU weight-only kernels read 0.5 (int4) or 1 (int8) byte per weight instead of 4, which is what a decode step
at small batches is bound by; they are fast only with bfloat16 activations, so each GEMM casts its input to bfloat16
and its output back to the model's dtype.
- int4: `w = (q - 8) * scale + zero` per group of `INT4_GROUP` input features, q in 0..15, scale and zero in bfloat16.
- int8: `w = q * scale` per output channel, q in -127..127, scale in bfloat16.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from tandem_server.weights.quantization import (
    INT4_GROUP,
    INT4_MIDPOINT,
    Int4Groups,
    Int8Channels,
    Int8Groups,
    quantize_int8,
)

ACTIVATION_DTYPE = torch.bfloat16


class Int4Weight:
    """An int4 groupwise weight packed for `torch._weight_int4pack_mm_for_cpu`.

    From `DENSE_MIN_ROWS` rows on (prefill chunks), each GEMM instead unpacks the weight to float and multiplies
    densely, which is faster there; both paths multiply by the same values.
    """

    def __init__(self, groups: Int4Groups) -> None:
        self.out_features, self.in_features = groups.q.shape
        self.packed = torch._convert_weight_to_int4pack_for_cpu(groups.q.to(torch.int32), 1)
        # The kernel reads [in / group, out, 2]: each group's scale and zero for every output feature.
        self.scales_and_zeros = torch.stack([groups.scale.t(), groups.zero.t()], dim=-1).to(ACTIVATION_DTYPE)
        self.nbytes = _nbytes(self.packed) + _nbytes(self.scales_and_zeros)
        self.unpackable = self.out_features % _PACKED_ROW_BLOCK == 0 and packed_layout_is_known()

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if x.shape[0] >= DENSE_MIN_ROWS and self.unpackable:
            return F.linear(x, self.dequantize().to(x.dtype), bias)
        out = torch._weight_int4pack_mm_for_cpu(x.to(ACTIVATION_DTYPE), self.packed, INT4_GROUP, self.scales_and_zeros)
        out = out.to(x.dtype)
        return out if bias is None else out + bias

    def dequantize(self) -> torch.Tensor:
        """The float32 `[out, in]` weight the kernel multiplies by (only when `unpackable`)."""
        q = _unpack_nibbles(self.packed, self.out_features, self.in_features).view(self.out_features, -1, INT4_GROUP)
        scale = self.scales_and_zeros[..., 0].t().float().contiguous().unsqueeze(-1)
        zero = self.scales_and_zeros[..., 1].t().float().contiguous().unsqueeze(-1)
        return torch.addcmul(zero, q.float() - INT4_MIDPOINT, scale).view(self.out_features, self.in_features)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows `ids` of the weight (an embedding lookup), unpacking only their blocks (only when `unpackable`)."""
        flat = ids.reshape(-1)
        blocks = self.packed.view(-1, self.in_features, _PACKED_ROW_BLOCK // 2)[flat // _PACKED_ROW_BLOCK]
        nibbles = torch.cat([blocks & 0x0F, blocks >> 4], dim=-1)
        within = (flat % _PACKED_ROW_BLOCK).view(-1, 1, 1).expand(-1, self.in_features, 1)
        q = nibbles.gather(2, within).view(flat.shape[0], -1, INT4_GROUP).float()
        scale = self.scales_and_zeros[:, flat, 0].t().float().contiguous().unsqueeze(-1)
        zero = self.scales_and_zeros[:, flat, 1].t().float().contiguous().unsqueeze(-1)
        values = torch.addcmul(zero, q - INT4_MIDPOINT, scale)
        return values.view(*ids.shape, self.in_features).to(dtype)


class Int8GroupsWeight:
    """An int8 weight with a scale per group of 32 inputs (GGUF's Q8_0), exactly: two int4 weights, its high and
    low nibbles, multiplied and summed (torch's int8 kernel takes one scale per output channel only)."""

    def __init__(self, groups: Int8Groups) -> None:
        high, low = groups.nibble_planes()
        self.high, self.low = Int4Weight(high), Int4Weight(low)
        self.out_features, self.in_features = groups.q.shape
        self.nbytes = self.high.nbytes + self.low.nbytes

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = self.high.linear(x, None) + self.low.linear(x, None)
        return out if bias is None else out + bias

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return (self.high.rows(ids, torch.float32) + self.low.rows(ids, torch.float32)).to(dtype)


# Measured on 2 AVX2 cores (1 thread, a 3072 x 576 weight): the int4 kernel takes 0.73 / 9.1 / 29 / 107 ms at 1 / 32 /
# 128 / 512 rows, float32 dense 1.7 / 10 / 19 / 67 ms, and unpacking the weight 22 ms; unpack-and-dense wins from
# about 256 rows (76 ms at 512).
DENSE_MIN_ROWS = 256
# torch's CPU int4 layout: per block of 32 output rows, byte j of input column c holds row j in its low nibble and
# row j + 16 in its high nibble. Checked once against torch's own packing before it is relied on.
_PACKED_ROW_BLOCK = 32


def _unpack_nibbles(packed: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    blocks = packed.view(out_features // _PACKED_ROW_BLOCK, in_features, _PACKED_ROW_BLOCK // 2)
    return torch.cat([blocks & 0x0F, blocks >> 4], dim=-1).transpose(1, 2).reshape(out_features, in_features)


@functools.cache
def packed_layout_is_known() -> bool:
    """Whether this torch build packs int4 weights in the layout `_unpack_nibbles` reads."""
    q = torch.randint(0, 16, (2 * _PACKED_ROW_BLOCK, 2 * INT4_GROUP), generator=torch.Generator().manual_seed(0))
    packed = torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    if packed.dtype != torch.uint8 or packed.numel() * 2 != q.numel():
        return False
    return torch.equal(_unpack_nibbles(packed, *q.shape).to(q.dtype), q)


class Int8Weight:
    """An int8 per-channel weight for `torch._weight_int8pack_mm`; also serves embedding lookups of its rows."""

    def __init__(self, channels: Int8Channels) -> None:
        self.out_features, self.in_features = channels.q.shape
        self.q = channels.q.contiguous()
        self.scale = channels.scale.float()
        self.kernel_scale = channels.scale.to(ACTIVATION_DTYPE)
        self.nbytes = _nbytes(self.q) + _nbytes(self.scale) + _nbytes(self.kernel_scale)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = torch._weight_int8pack_mm(x.to(ACTIVATION_DTYPE), self.q, self.kernel_scale).to(x.dtype)
        return out if bias is None else out + bias

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Dequantized rows `ids` (an embedding lookup)."""
        return (F.embedding(ids, self.q).float() * F.embedding(ids, self.scale.unsqueeze(-1))).to(dtype)


QuantizedWeight = Int4Weight | Int8Weight | Int8GroupsWeight


def quantized_weight(source: Int4Groups | Int8Groups | Int8Channels) -> QuantizedWeight:
    """The kernel-ready form of unpacked quantized values (int8 groups need the known int4 layout, else they are
    rounded to int8 channels)."""
    if isinstance(source, Int4Groups):
        return Int4Weight(source)
    if isinstance(source, Int8Groups):
        if source.q.shape[0] % _PACKED_ROW_BLOCK == 0 and packed_layout_is_known():
            return Int8GroupsWeight(source)
        return Int8Weight(quantize_int8(source.dequantize()))
    return Int8Weight(source)


def rows_available(weight: QuantizedWeight) -> bool:
    """Whether `weight.rows` can serve embedding lookups."""
    return isinstance(weight, Int8Weight) or (
        weight.unpackable if isinstance(weight, Int4Weight) else weight.high.unpackable
    )


def format_name(weight: QuantizedWeight) -> str:
    return {Int4Weight: "int4", Int8Weight: "int8", Int8GroupsWeight: "int8 in groups of 32"}[type(weight)]


def kernels_unavailable_reason(device: torch.device) -> str | None:
    """None when this device and torch build have the weight-only kernels, else why not."""
    if device.type != "cpu":
        return "quantized GEMMs are a CPU path"
    if not hasattr(torch, "_convert_weight_to_int4pack_for_cpu") or not hasattr(torch, "_weight_int8pack_mm"):
        return "this torch build has no CPU weight-only int4/int8 kernels"
    return None


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
