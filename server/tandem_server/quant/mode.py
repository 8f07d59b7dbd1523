"""`--quantize`: how the shard stores GEMM weights."""

from __future__ import annotations

import enum


class QuantizeMode(enum.Enum):
    """How the shard stores GEMM weights: float, the checkpoint's GGUF blocks, or quantized at load.

    An FP8 checkpoint's float8 weights stay float8 whatever the mode; the mode decides its float weights.
    """

    NONE = "none"
    GGUF = "gguf"
    INT8 = "int8"
    INT4 = "int4"
    FP8 = "fp8"
