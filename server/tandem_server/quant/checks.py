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
    check_expert_weights(mode, checkpoint, device)
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


# The `--quantize` values a mixture-of-experts model is served with: its experts stay float, keep a GGUF's blocks, or
# keep an FP8 checkpoint's float8 weights; quantizing float experts at load has no kernel.
MOE_QUANTIZE_MODES = (QuantizeMode.NONE, QuantizeMode.GGUF)


def check_expert_weights(mode: QuantizeMode, checkpoint: CheckpointConfig, device: torch.device) -> None:
    """Refuses a `--quantize` that would quantize a mixture-of-experts model's float weights at load, and int4
    checkpoints of one: its experts would stay float while the rest is quantized, a model between two precisions.
    Quantized experts are a CPU path: an FP8 checkpoint of one is refused on other devices."""
    if not checkpoint.num_experts:
        return
    allowed = ", ".join(allowed_mode.value for allowed_mode in MOE_QUANTIZE_MODES)
    what = f"{checkpoint.architecture} is a mixture-of-experts model"
    if mode not in MOE_QUANTIZE_MODES:
        raise ConfigError(
            f"--quantize {mode.value}: {what}, whose experts are served float, from a converted GGUF's blocks "
            f"(--quantize gguf) or from an FP8 checkpoint's float8 weights (--quantize none); allowed: {allowed}"
        )
    if checkpoint.int4 is not None:
        raise ConfigError(
            f"{checkpoint.path} is a {checkpoint.int4.method} checkpoint, but {what}, whose experts are served float, "
            "from GGUF blocks or float8 weights only; give a float, GGUF or FP8 one"
        )
    if checkpoint.fp8 is not None and device.type != "cpu":
        raise ConfigError(
            f"{checkpoint.path} is an FP8 checkpoint ({checkpoint.fp8.method}) of a mixture-of-experts model, whose "
            f"float8 experts run on CPU only ({device.type} has no quantized expert kernel); serve it on CPU or give "
            "a bfloat16 checkpoint"
        )
