"""Refuses, before anything loads, a `--quantize` that the checkpoint or the device cannot serve."""

from __future__ import annotations

import torch

from tandem_server.errors import ConfigError
from tandem_server.models.config import CheckpointConfig
from tandem_server.quant.int4.scheme import Int4Scheme
from tandem_server.quant.kernels import kernels_unavailable_reason
from tandem_server.quant.mode import QuantizeMode
from tandem_server.weights.gguf_format import has_gguf_blocks


def check_quantization(mode: QuantizeMode, checkpoint: CheckpointConfig, device: torch.device) -> None:
    """Refuses, before anything loads, a `--quantize` this checkpoint or device cannot serve."""
    check_expert_weights(mode, checkpoint)
    check_int4_checkpoint(mode, checkpoint.int4, device)
    if checkpoint.fp8 is not None:
        if mode not in (QuantizeMode.NONE, QuantizeMode.FP8):
            raise ConfigError(
                f"--quantize {mode.value}: {checkpoint.path} is an FP8 checkpoint ({checkpoint.fp8.method}); "
                "serve it with --quantize none (its float8 layers stay float8) or fp8"
            )
        unavailable = kernels_unavailable_reason(device, QuantizeMode.FP8)
        if unavailable is not None:
            raise ConfigError(f"FP8 checkpoint ({checkpoint.fp8.method}): {unavailable}")
    if mode is not QuantizeMode.NONE:
        unavailable = kernels_unavailable_reason(device, mode)
        if unavailable is not None:
            raise ConfigError(f"--quantize {mode.value}: {unavailable}")
    if mode is QuantizeMode.GGUF and not has_gguf_blocks(checkpoint.path):
        raise ConfigError(
            f"--quantize gguf: {checkpoint.path} keeps no GGUF blocks (only a converted .gguf model does)"
        )


def check_int4_checkpoint(mode: QuantizeMode, scheme: Int4Scheme | None, device: torch.device) -> None:
    """Refuses, before anything loads, a GPTQ or AWQ checkpoint with another `--quantize`, or on a device the int4
    kernel does not run on."""
    if scheme is None:
        return
    what = f"{scheme.method.upper()} int4 checkpoint"
    if mode is not QuantizeMode.NONE:
        raise ConfigError(
            f"--quantize {mode.value}: {what}s are served with --quantize none (their int4 layers stay int4)"
        )
    unavailable = kernels_unavailable_reason(device, QuantizeMode.INT4)
    if unavailable is not None:
        raise ConfigError(f"{what}: {unavailable}")


def check_expert_weights(mode: QuantizeMode, checkpoint: CheckpointConfig) -> None:
    """Refuses quantized weights for a mixture-of-experts model: its experts are stacked 3-D weights that no
    quantized format holds, and quantizing only its attention and dense layers would serve a model between two
    precisions."""
    if not checkpoint.num_experts:
        return
    what = f"{checkpoint.architecture} is a mixture-of-experts model, whose stacked expert weights are served float"
    if mode is not QuantizeMode.NONE:
        raise ConfigError(f"--quantize {mode.value}: {what} only; use --quantize none")
    for scheme in (checkpoint.fp8, checkpoint.int4):
        if scheme is not None:
            raise ConfigError(f"{checkpoint.path} is a {scheme.method} checkpoint, but {what} only; give a float one")
