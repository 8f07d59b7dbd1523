"""The quantized weights' kernels by scheme: which form unpacked values take where they live, what each form can
serve besides its GEMM, and whether a device has the kernels a `--quantize` mode needs.

Each scheme's weights live in its folder: int4 (`int4/weight.py`), int8 (`int8/weight.py`), fp8 (`fp8/weight.py`).
"""

from __future__ import annotations

import torch

from tandem_server.quant.fp8 import weight as fp8
from tandem_server.quant.fp8.weight import Fp8Weight
from tandem_server.quant.int4 import weight as int4
from tandem_server.quant.int4.cpu_layout import packed_block
from tandem_server.quant.int4.weight import ACTIVATION_DTYPE, Int4TritonWeight, Int4Weight
from tandem_server.quant.int8.weight import Int8GroupsWeight, Int8Weight
from tandem_server.quant.mode import QuantizeMode
from tandem_server.quant.values import INT4_OUT_MULTIPLE, Int4Groups, Int8Channels, Int8Groups, quantize_int8

QuantizedWeight = Int4Weight | Int4TritonWeight | Int8Weight | Int8GroupsWeight | Fp8Weight


def quantized_weight(
    source: Int4Groups | Int8Groups | Int8Channels, dtype: torch.dtype = ACTIVATION_DTYPE
) -> QuantizedWeight:
    """The kernel-ready form of unpacked quantized values where they live (int4 on CUDA: Tandem's Triton kernel, its
    scales in the model's `dtype`); int8 groups need the known int4 layout, else they are rounded to int8 channels."""
    if isinstance(source, Int4Groups):
        return Int4TritonWeight(source, dtype) if source.q.is_cuda else Int4Weight(source)
    if isinstance(source, Int8Groups):
        if source.q.shape[0] % INT4_OUT_MULTIPLE == 0 and packed_block() is not None:
            return Int8GroupsWeight(source)
        return Int8Weight(quantize_int8(source.dequantize()))
    return Int8Weight(source)


def rows_available(weight: QuantizedWeight) -> bool:
    """Whether `weight.rows` can serve embedding lookups (never on CUDA: the embedding there stays dense)."""
    if isinstance(weight, Int4TritonWeight):
        return False
    if isinstance(weight, Int4Weight):
        return weight.unpackable and weight.input_order is None
    return isinstance(weight, (Int8Weight, Fp8Weight)) or weight.high.unpackable


def dense_values(weight: QuantizedWeight) -> torch.Tensor | None:
    """The float32 `[out, in]` values a CPU weight multiplies by, input features in the checkpoint's order; None for
    a weight that cannot unpack (float8, CUDA, an unknown int4 layout)."""
    if isinstance(weight, Int8Weight):
        return weight.q.float() * weight.scale.unsqueeze(-1)
    if isinstance(weight, Int8GroupsWeight):
        if not weight.high.unpackable:
            return None
        return weight.high.dequantize() + weight.low.dequantize()
    if not isinstance(weight, Int4Weight) or not weight.unpackable:
        return None
    values = weight.dequantize()
    if weight.input_order is None:
        return values
    # Column j multiplies input feature input_order[j].
    ordered = torch.empty_like(values)
    ordered[:, weight.input_order] = values
    return ordered


def format_name(weight: QuantizedWeight) -> str:
    names = {Int4Weight: "int4", Int4TritonWeight: "int4", Int8Weight: "int8", Fp8Weight: "fp8"}
    names[Int8GroupsWeight] = "int8 in groups of 32"
    return names[type(weight)]


def kernels_unavailable_reason(device: torch.device, mode: QuantizeMode) -> str | None:
    """None when this device and torch build have the kernels `mode` needs, else why not."""
    if mode is QuantizeMode.FP8:
        return fp8.unavailable_reason(device)
    if mode is QuantizeMode.INT4 and device.type == "cuda":
        return int4.cuda_unavailable_reason(device)
    if device.type != "cpu":
        return (
            f"{mode.value} GEMMs are a CPU path (on CUDA, int4 runs through Tandem's Triton kernel; int8 and GGUF's "
            "int8 groups have no CUDA kernel)"
        )
    if not hasattr(torch, "_convert_weight_to_int4pack_for_cpu") or not hasattr(torch, "_weight_int8pack_mm"):
        return "this torch build has no CPU weight-only int4/int8 kernels"
    return None
