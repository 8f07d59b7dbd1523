"""int4 groupwise weights: on CPU for torch's weight-only kernel (`torch._weight_int4pack_mm_for_cpu`), on CUDA for
Tandem's Triton kernel (`triton_gemm`).

`w = (q - 8) * scale + zero` per group of 32 to 256 input features, q in 0..15, scale and zero in bfloat16. torch's
CPU kernel reads 0.5 byte per weight instead of 4, which is what a decode step at small batches is bound by; it is fast
only with bfloat16 activations, so each GEMM casts its input to bfloat16 and its output back to the model's dtype.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

from tandem_server.quant.int4.cpu_layout import PackedLayout, packed_block
from tandem_server.quant.values import INT4_MIDPOINT, INT4_OUT_MULTIPLE, Int4Groups, tensor_bytes

ACTIVATION_DTYPE = torch.bfloat16
# The int4 Triton kernel's bfloat16 dots (Ampere onwards); it is compiled and checked for sm80 and sm90.
INT4_CUDA_MIN_CAPABILITY = (8, 0)
# Measured on 2 AVX2 cores (1 thread, a 3072 x 576 weight): the int4 kernel takes 0.73 / 9.1 / 29 / 107 ms at 1 / 32 /
# 128 / 512 rows, float32 dense 1.7 / 10 / 19 / 67 ms, and unpacking the weight 22 ms; unpack-and-dense wins from
# about 256 rows (76 ms at 512).
DENSE_MIN_ROWS = 256


class Int4Weight:
    """An int4 groupwise weight packed for `torch._weight_int4pack_mm_for_cpu`.

    From `DENSE_MIN_ROWS` rows on (prefill chunks), each GEMM instead unpacks the weight to float and multiplies
    densely, which is faster there; both paths multiply by the same values.
    """

    name = "int4"

    def __init__(self, groups: Int4Groups) -> None:
        self.out_features, self.in_features = groups.q.shape
        if self.out_features % INT4_OUT_MULTIPLE:
            raise ValueError(
                f"the int4 kernel needs output features in multiples of {INT4_OUT_MULTIPLE}, this weight has "
                f"{self.out_features}"
            )
        self.group_size = groups.group_size
        self.input_order = groups.input_order
        self.packed = torch._convert_weight_to_int4pack_for_cpu(groups.q.to(torch.int32), 1)
        # The kernel reads [in / group, out, 2]: each group's scale and zero for every output feature.
        self.scales_and_zeros = torch.stack([groups.scale.t(), groups.zero.t()], dim=-1).to(ACTIVATION_DTYPE)
        self.nbytes = tensor_bytes(self.packed) + tensor_bytes(self.scales_and_zeros)
        block = packed_block()
        self.layout = None if block is None else PackedLayout(block, self.out_features, self.in_features)
        self.unpackable = self.layout is not None

    @property
    def quantized(self) -> Int4Weight:
        return self

    @property
    def serves_rows(self) -> bool:
        """Whether `rows` can serve embedding lookups."""
        return self.unpackable and self.input_order is None

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.input_order is not None:
            x = x.index_select(-1, self.input_order)
        if x.shape[0] >= DENSE_MIN_ROWS and self.unpackable:
            return F.linear(x, self.dequantize().to(x.dtype), bias)
        out = torch._weight_int4pack_mm_for_cpu(
            x.to(ACTIVATION_DTYPE), self.packed, self.group_size, self.scales_and_zeros
        )
        out = out.to(x.dtype)
        return out if bias is None else out + bias

    def dequantize(self) -> torch.Tensor:
        """The float32 `[out, in]` weight the kernel multiplies by, columns in `input_order` (only when
        `unpackable`)."""
        q = self._layout().unpack(self.packed).view(self.out_features, -1, self.group_size)
        scale = self.scales_and_zeros[..., 0].t().float().contiguous().unsqueeze(-1)
        zero = self.scales_and_zeros[..., 1].t().float().contiguous().unsqueeze(-1)
        return torch.addcmul(zero, q.float() - INT4_MIDPOINT, scale).view(self.out_features, self.in_features)

    def dense_values(self) -> torch.Tensor | None:
        """The float32 `[out, in]` values the kernel multiplies by, input features in the checkpoint's order; None
        when this CPU's packing cannot be read back."""
        if not self.unpackable:
            return None
        values = self.dequantize()
        if self.input_order is None:
            return values
        # Column j multiplies input feature input_order[j].
        ordered = torch.empty_like(values)
        ordered[:, self.input_order] = values
        return ordered

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows `ids` of the weight (an embedding lookup), unpacking only their blocks (only when `unpackable`)."""
        flat = ids.reshape(-1)
        q = self._layout().rows(self.packed, flat).view(flat.shape[0], -1, self.group_size).float()
        scale = self.scales_and_zeros[:, flat, 0].t().float().contiguous().unsqueeze(-1)
        zero = self.scales_and_zeros[:, flat, 1].t().float().contiguous().unsqueeze(-1)
        values = torch.addcmul(zero, q - INT4_MIDPOINT, scale)
        return values.view(*ids.shape, self.in_features).to(dtype)

    def _layout(self) -> PackedLayout:
        if self.layout is None:
            raise ValueError("this CPU packs int4 weights in a layout Tandem cannot read back")
        return self.layout


class Int4TritonWeight:
    """An int4 groupwise weight on a CUDA device for Tandem's Triton kernel (`triton_gemm`): the values `Int4Weight`
    multiplies by, packed eight to an int32, scales and zeros in bfloat16 or float16 (`dtype`); activations of
    another dtype are cast to it and the output back."""

    name = "int4"
    # An embedding on CUDA stays dense.
    serves_rows = False

    def __init__(self, groups: Int4Groups, dtype: torch.dtype = ACTIVATION_DTYPE) -> None:
        from tandem_server.quant.int4 import triton_gemm  # noqa: PLC0415  (Triton only when a weight is on CUDA)

        self._kernel = triton_gemm
        self.out_features, self.in_features = groups.q.shape
        self.group_size = groups.group_size
        self.input_order = groups.input_order
        self.dtype = dtype if dtype in triton_gemm.ACTIVATION_DTYPES else ACTIVATION_DTYPE
        self.words = triton_gemm.pack(groups.q)
        self.scale = groups.scale.t().to(self.dtype).contiguous()
        self.zero = groups.zero.t().to(self.dtype).contiguous()
        self.nbytes = tensor_bytes(self.words) + tensor_bytes(self.scale) + tensor_bytes(self.zero)

    @property
    def quantized(self) -> Int4TritonWeight:
        return self

    def dense_values(self) -> None:
        """None: a CUDA weight gets no bfloat16 copy (copies are a CPU path)."""
        return None

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.input_order is not None:
            x = x.index_select(-1, self.input_order)
        out = self._kernel.int4_gemm(x.to(self.dtype), self.words, self.scale, self.zero, self.group_size)
        out = out.to(x.dtype)
        return out if bias is None else out + bias

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Never called: an embedding on CUDA stays dense (`serves_rows` is False for this format)."""
        raise TypeError("invariant: a CUDA int4 weight serves no embedding rows")


def cuda_unavailable_reason(device: torch.device) -> str | None:
    """None when Tandem's Triton kernel can run int4 GEMMs on this CUDA device, else why not."""
    if importlib.util.find_spec("triton") is None:
        return "int4 GEMMs on CUDA run through Tandem's Triton kernel, and Triton is not installed"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < INT4_CUDA_MIN_CAPABILITY:
        return (
            f"the int4 Triton kernel needs a GPU of compute capability "
            f"{'.'.join(map(str, INT4_CUDA_MIN_CAPABILITY))} or newer (bfloat16 dots: Ampere onwards); "
            f"{torch.cuda.get_device_name(device)} is {major}.{minor}"
        )
    return None
