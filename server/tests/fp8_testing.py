"""Tiny FP8 checkpoints in the layouts published on the Hub, written from a float checkpoint, with the float
checkpoint of exactly the values they hold (the reference)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from tandem_server.weights.quantization import FP8_DTYPE, FP8_MAX

LINEAR_SUFFIXES = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "qkv_proj",
    "gate_up_proj",
)
# Roles whose per-tensor scale is stored with shape [] (the rest [1]): both appear on the Hub.
SCALAR_SHAPED = ("o_proj", "down_proj")
LAYOUTS = ("compressed-tensors-tensor", "compressed-tensors-channel", "fbgemm")


def compressed_tensors_config(weight_strategy: str, static_activations: bool) -> dict[str, Any]:
    activations = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": not static_activations}
    activations["strategy"] = "tensor" if static_activations else "token"
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 8,
                    "type": "float",
                    "symmetric": True,
                    "strategy": weight_strategy,
                    "dynamic": False,
                    "group_size": None,
                    "block_structure": None,
                },
                "input_activations": activations,
            }
        },
    }


FBGEMM_CONFIG = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": ["lm_head"]}


def _is_linear(name: str) -> bool:
    return name.endswith(".weight") and name.rsplit(".", 2)[-2] in LINEAR_SUFFIXES


def _stored_scale(weight: torch.Tensor, name: str, per_channel: bool) -> torch.Tensor:
    if per_channel:
        return weight.float().abs().amax(-1, keepdim=True) / FP8_MAX
    shape = () if name.removesuffix(".weight").endswith(SCALAR_SHAPED) else (1,)
    return (weight.float().abs().amax() / FP8_MAX).bfloat16().reshape(shape)


def write_fp8_checkpoint(
    float_dir: Path, out_dir: Path, layout: str, input_amax: dict[str, float] | None = None
) -> dict[str, torch.Tensor]:
    """Writes `float_dir`'s checkpoint to `out_dir` in `layout` and returns the float state dict it stands for.

    Per-tensor weight scales are bfloat16 (shape [1], or [] for SCALAR_SHAPED roles), per-channel ones float32
    [out, 1]. With `input_amax` (each linear layer's largest input magnitude, by weight name) a compressed-tensors
    layout gets static input scales; else activations are scaled per token.
    """
    tensors = load_file(str(float_dir / "model.safetensors"))
    per_channel = layout != "compressed-tensors-tensor"
    static = input_amax is not None and layout != "fbgemm"
    stored: dict[str, torch.Tensor] = {}
    dequantized: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if not _is_linear(name):
            stored[name] = dequantized[name] = tensor
            continue
        prefix = name.removesuffix(".weight")
        scale = _stored_scale(tensor, name, per_channel)
        q = (tensor.float() / scale.float().reshape(-1, 1)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
        if static and input_amax is not None:
            stored[f"{prefix}.input_scale"] = torch.tensor([input_amax[name] / FP8_MAX])
        stored[name], stored[f"{prefix}.weight_scale"] = q, scale
        dequantized[name] = q.float() * scale.float().reshape(-1, 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(stored, str(out_dir / "model.safetensors"))
    for file in float_dir.iterdir():
        if file.suffix == ".json":
            shutil.copy(file, out_dir / file.name)
    config = json.loads((float_dir / "config.json").read_text())
    config["quantization_config"] = (
        FBGEMM_CONFIG
        if layout == "fbgemm"
        else compressed_tensors_config("channel" if per_channel else "tensor", static_activations=static)
    )
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return dequantized


def linear_input_amax(reference: torch.nn.Module, calibration: torch.Tensor) -> dict[str, float]:
    """Each linear layer's largest input magnitude over `calibration` ids, by its weight's name (static scales)."""
    amax: dict[str, float] = {}
    hooks = []
    for name, module in reference.named_modules():
        if isinstance(module, torch.nn.Linear):

            def record(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], name: str = name) -> None:
                amax[f"{name}.weight"] = max(amax.get(f"{name}.weight", 0.0), inputs[0].abs().max().item())

            hooks.append(module.register_forward_pre_hook(record))
    with torch.no_grad():
        reference(calibration)
    for hook in hooks:
        hook.remove()
    return amax


def round_activations_like_fp8(
    reference: torch.nn.Module,
    static_scales: dict[str, float] | None = None,
    bound: float | None = None,
    roles: tuple[str, ...] = LINEAR_SUFFIXES,
) -> None:
    """Makes the linear layers of `reference` in `roles` round their input to float8 e4m3 as the FP8 GEMM does: per
    token (largest magnitude capped at `bound`), or by the static scale of `static_scales` (by weight name)."""
    for name, module in reference.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in roles:
            static = None if static_scales is None else static_scales[f"{name}.weight"]

            def rounded(
                module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], static: float | None = static
            ) -> Any:
                x = inputs[0].float()
                if static is not None:
                    scale = torch.full_like(x[..., :1], static)
                else:
                    largest = x.abs().amax(-1, keepdim=True)
                    scale = (largest if bound is None else largest.clamp_max(bound)) / FP8_MAX
                    scale = scale.clamp_min(1.0 / (FP8_MAX * 512.0))
                return ((x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).float() * scale,)

            module.register_forward_pre_hook(rounded)
