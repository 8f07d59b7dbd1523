"""The MXFP4 layout of gpt-oss's published expert weights (the OCP microscaling format, as transformers reads it).

A weight `[..., rows, columns]` is stored as two uint8 tensors named after it:
- `{name}_blocks [..., rows, columns / 32, 16]`: each run of 32 consecutive values of a row packed as E2M1 codes,
  two per byte, the value at the even position in the low nibble;
- `{name}_scales [..., rows, columns / 32]`: each run's shared scale as an E8M0 exponent, `2 ** (byte - 127)`.

gpt-oss's experts hold their weights this way with rows as output features: `gate_up_proj [experts, 2 * I, hidden]`
(gate and up features interleaved) and `down_proj [experts, hidden, I]`.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

MXFP4_METHOD = "mxfp4"
# Values sharing one scale, and the bytes their codes take.
BLOCK_VALUES = 32
BLOCK_BYTES = BLOCK_VALUES // 2
SCALE_BIAS = 127
# The value of each E2M1 code (sign bit, two exponent bits, one mantissa bit).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def is_mxfp4(quantization_config: dict[str, Any]) -> bool:
    """Whether config.json's `quantization_config` declares MXFP4 weights."""
    return quantization_config.get("quant_method") == MXFP4_METHOD


@functools.cache
def pair_values(dtype: torch.dtype) -> torch.Tensor:
    """`[65536, 4]` on the CPU: the four values two consecutive packed bytes hold, indexed by the bytes read as one
    little-endian 16-bit integer (the first byte low), each byte's low nibble first. Shared by every caller."""
    cpu = torch.device("cpu")
    codes = torch.arange(256, device=cpu)
    table = torch.tensor(E2M1_VALUES, dtype=dtype, device=cpu)
    byte_values = torch.stack((table[codes & 0x0F], table[codes >> 4]), dim=-1)
    pairs = torch.arange(65536, device=cpu)
    return torch.cat((byte_values[pairs & 0xFF], byte_values[pairs >> 8]), dim=-1)


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The `[..., rows, columns]` weight of `blocks [..., rows, groups, 16]` and `scales [..., rows, groups]`, in the
    dtype of `values` (`pair_values`); exact, as every E2M1 value times a power of two is representable there.

    Two bytes are looked up at a time (torch runs on little-endian hosts only), and each block is multiplied by its
    scale as a power of two rather than through `ldexp`: measured 3-6 times faster than one byte at a time and ldexp.
    """
    pairs = blocks.view(torch.int16).int() & 0xFFFF
    codes = F.embedding(pairs, values).flatten(-2)
    scale = torch.exp2(scales.to(torch.float32) - SCALE_BIAS).to(values.dtype)
    return (codes * scale.unsqueeze(-1)).flatten(-2)
