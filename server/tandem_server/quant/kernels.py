"""The quantized weights' kernels by scheme: which form unpacked values take where they live, and whether a device
has the kernels a `--quantize` mode needs.

Each scheme's weights live in its folder: int4 (`int4/weight.py`), int8 (`int8/weight.py`), fp8 (`fp8/weight.py`).
Each is a `WeightFormat` (`format.py`) that also says whether it serves embedding rows (`serves_rows`, `rows`) and
which float values a bfloat16 copy of it holds (`dense_values`).
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
