"""The shard's `auto` weight settings, chosen from the model and the machine, each with the reason it logs.

- `--quantize auto`: a GGUF model on the CPU serves its own quantized blocks; anything else keeps float weights.
- `--dtype auto`: bfloat16 on CUDA and on CPUs that multiply it natively (AVX-512 BF16 or AMX), else float32.
- `--quantized-dense-memory auto`: bfloat16 copies of quantized weights for batches on such CPUs, within half the
  available memory (`layers/dense_copies.py`); none on CUDA.

A value the user gave is kept as given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from tandem_server.config import parse_quantized_dense_memory, resolve_dtype
from tandem_server.quant.mode import QuantizeMode
from tandem_server.weights.gguf_format import has_gguf_blocks

AUTO = "auto"


@dataclass(frozen=True)
class WeightSettings:
    """The resolved `--quantize`, `--dtype` and `--quantized-dense-memory` (None: `auto`'s budget)."""

    quantize: QuantizeMode
    dtype: torch.dtype
    quantized_dense_memory: int | None
    reasons: tuple[str, ...]


def cpu_multiplies_bfloat16() -> bool:
    """Whether this CPU has bfloat16 dot products, with which bfloat16 matmuls run about twice float32's speed."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def choose_weight_settings(
    quantize: str, dtype: str, quantized_dense_memory: str, device: str, model_path: Path, bfloat16_cpu: bool
) -> WeightSettings:
    """Resolves the three flags for a shard on `device` serving `model_path`; `bfloat16_cpu`: see
    `cpu_multiplies_bfloat16`."""
    mode, mode_reason = _quantize(quantize, device, model_path)
    chosen_dtype, dtype_reason = _dtype(dtype, device, bfloat16_cpu)
    memory, memory_reason = _dense_memory(quantized_dense_memory, device, mode)
    shown_memory = AUTO if memory is None else quantized_dense_memory.strip() if memory else "0"
    reasons = (
        f"--quantize {mode.value}: {mode_reason}",
        f"--dtype {str(chosen_dtype).removeprefix('torch.')}: {dtype_reason}",
        f"--quantized-dense-memory {shown_memory}: {memory_reason}",
    )
    return WeightSettings(mode, chosen_dtype, memory, reasons)


def _quantize(value: str, device: str, model_path: Path) -> tuple[QuantizeMode, str]:
    if value != AUTO:
        return QuantizeMode(value), "as given"
    if device != "cpu":
        return QuantizeMode.NONE, "float weights on CUDA (int4 and fp8 are opt-in there)"
    if has_gguf_blocks(model_path):
        return QuantizeMode.GGUF, "the model is a GGUF: its quantized blocks are served as they are"
    return QuantizeMode.NONE, "the model has no GGUF blocks: float weights"


def _dtype(value: str, device: str, bfloat16_cpu: bool) -> tuple[torch.dtype, str]:
    if value != AUTO:
        return resolve_dtype(value), "as given"
    if device != "cpu":
        return torch.bfloat16, "CUDA computes in bfloat16"
    if bfloat16_cpu:
        return torch.bfloat16, "the CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX)"
    return torch.float32, "the CPU has neither AVX-512 BF16 nor AMX, so float32 runs faster"


def _dense_memory(value: str, device: str, mode: QuantizeMode) -> tuple[int | None, str]:
    if value.strip() != AUTO:
        return parse_quantized_dense_memory(value), "as given"
    if device != "cpu":
        return 0, "a CPU option"
    if mode is QuantizeMode.NONE:
        return 0, "the weights are not quantized"
    return None, "bfloat16 copies serve batches of 6 or more rows where the CPU has AVX-512 BF16 or AMX"
