"""Tiny FP8 checkpoints in the layouts published on the Hub, written from a float checkpoint, with the float
checkpoint of exactly the values they hold (the reference)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from tandem_server.distributed import ParallelContext
from tandem_server.layers.attention import TorchAttentionBackend
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.loader import load_model
from tandem_server.models.registry import CausalLM
from tandem_server.quant.mode import QuantizeMode
from tandem_server.quant.quantize import QuantizationReport, quantize_model
from tandem_server.quant.values import FP8_DTYPE, FP8_MAX

CPU = torch.device("cpu")

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
LAYOUTS = ("compressed-tensors-tensor", "compressed-tensors-channel", "fbgemm", "autofp8", "block")
# Smaller than the Hub's 128 x 128 so that the tiny layers span several blocks, partial ones included (64 and 32 rows,
# 64 and 128 inputs).
TEST_BLOCK = (24, 48)


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


def fp8_config(static_activations: bool, ignored: tuple[str, ...] = ()) -> dict[str, Any]:
    """AutoFP8's config (per-tensor scales)."""
    scheme = "static" if static_activations else "dynamic"
    return {"quant_method": "fp8", "activation_scheme": scheme, "ignored_layers": ["lm_head", *ignored]}


def block_config(block: tuple[int, int]) -> dict[str, Any]:
    """A block-wise config as DeepSeek-V3 and Qwen3 FP8 checkpoints write it."""
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(block)}


def _is_linear(name: str) -> bool:
    return name.endswith(".weight") and name.rsplit(".", 2)[-2] in LINEAR_SUFFIXES


def _block_scales(weight: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """One float32 scale per `block` of `weight`: its largest magnitude maps to `FP8_MAX`."""
    rows, inputs = block
    padded = torch.nn.functional.pad(weight.float().abs(), (0, -weight.shape[1] % inputs, 0, -weight.shape[0] % rows))
    blocks = padded.view(padded.shape[0] // rows, rows, padded.shape[1] // inputs, inputs)
    return blocks.amax(dim=(1, 3)) / FP8_MAX


def widen_blocks(scales: torch.Tensor, shape: torch.Size, block: tuple[int, int]) -> torch.Tensor:
    """Block scales repeated over the `shape` of the weight they scale."""
    rows, inputs = block
    return scales.repeat_interleave(rows, 0).repeat_interleave(inputs, 1)[: shape[0], : shape[1]]


def _quantize(
    name: str, weight: torch.Tensor, layout: str, block: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float8 values, the scale tensor as stored, and that scale widened over the weight."""
    if layout == "block":
        scale = _block_scales(weight, block)
        widened = widen_blocks(scale, weight.shape, block)
    else:
        scale = _stored_scale(weight, name, per_channel=layout in ("compressed-tensors-channel", "fbgemm"))
        widened = scale.float().reshape(-1, 1)
    q = (weight.float() / widened).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale, widened


def _stored_scale(weight: torch.Tensor, name: str, per_channel: bool) -> torch.Tensor:
    if per_channel:
        return weight.float().abs().amax(-1, keepdim=True) / FP8_MAX
    shape = () if name.removesuffix(".weight").endswith(SCALAR_SHAPED) else (1,)
    return (weight.float().abs().amax() / FP8_MAX).bfloat16().reshape(shape)


def write_fp8_checkpoint(
    float_dir: Path,
    out_dir: Path,
    layout: str,
    input_amax: dict[str, float] | None = None,
    ignored: tuple[str, ...] = (),
    block: tuple[int, int] = TEST_BLOCK,
) -> dict[str, torch.Tensor]:
    """Writes `float_dir`'s checkpoint to `out_dir` in `layout` and returns the float state dict it stands for.

    Per-tensor weight scales are bfloat16 (shape [1], or [] for SCALAR_SHAPED roles), per-channel ones float32
    [out, 1], block ones float32 [row blocks, input blocks] of `block`. With `input_amax` (each linear layer's
    largest input magnitude, by weight name) a compressed-tensors or AutoFP8 layout gets static input scales; else
    activations are scaled per token. AutoFP8 keeps the `ignored` modules (and the LM head) float.
    """
    tensors = load_file(str(float_dir / "model.safetensors"))
    static = input_amax is not None and layout not in ("fbgemm", "block")
    stored: dict[str, torch.Tensor] = {}
    dequantized: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        prefix = name.removesuffix(".weight")
        if not _is_linear(name) or prefix in ignored:
            stored[name] = dequantized[name] = tensor
            continue
        q, scale, widened = _quantize(name, tensor, layout, block)
        if static and input_amax is not None:
            stored[f"{prefix}.input_scale"] = torch.tensor([input_amax[name] / FP8_MAX])
        stored[name] = q
        stored[f"{prefix}.weight_scale_inv" if layout == "block" else f"{prefix}.weight_scale"] = scale
        dequantized[name] = q.float() * widened
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(stored, str(out_dir / "model.safetensors"))
    for file in float_dir.iterdir():
        if file.suffix == ".json":
            shutil.copy(file, out_dir / file.name)
    config = json.loads((float_dir / "config.json").read_text())
    config["quantization_config"] = _quantization_config(layout, static, ignored, block)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return dequantized


def _quantization_config(layout: str, static: bool, ignored: tuple[str, ...], block: tuple[int, int]) -> dict[str, Any]:
    if layout == "fbgemm":
        return FBGEMM_CONFIG
    if layout == "autofp8":
        return fp8_config(static, ignored)
    if layout == "block":
        return block_config(block)
    return compressed_tensors_config(layout.removeprefix("compressed-tensors-"), static_activations=static)


def load_fp8_checkpoint(path: Path, mode: QuantizeMode = QuantizeMode.NONE) -> tuple[CausalLM, QuantizationReport]:
    """Our float32 CPU model for the checkpoint at `path`, its GEMM weights quantized as `mode` says."""
    model = load_model(read_checkpoint_config(path), torch.float32, CPU, ParallelContext(), TorchAttentionBackend())
    return model, quantize_model(model, mode)


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
    input_group: int | None = None,
) -> None:
    """Makes the linear layers of `reference` in `roles` round their input to float8 e4m3 as the FP8 GEMM does: per
    token (largest magnitude capped at `bound`; per token and run of `input_group` features when given), or by the
    static scale of `static_scales` (by weight name)."""
    for name, module in reference.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in roles:
            static = None if static_scales is None else static_scales[f"{name}.weight"]

            def rounded(
                module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], static: float | None = static
            ) -> Any:
                x = inputs[0].float()
                runs = x.split(input_group or x.shape[-1], dim=-1)
                return (torch.cat([_round_like_fp8(run, static, bound) for run in runs], dim=-1),)

            module.register_forward_pre_hook(rounded)


def rounded_like_fp8(x: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """`x` rounded to float8 e4m3 as the GEMM scales activations: per token by its largest magnitude, or per token and
    run of `width` features."""
    runs = x.float().split(width or x.shape[-1], dim=-1)
    return torch.cat([_round_like_fp8(run, None, None) for run in runs], dim=-1)


def _round_like_fp8(x: torch.Tensor, static: float | None, bound: float | None) -> torch.Tensor:
    if static is not None:
        scale = torch.full_like(x[..., :1], static)
    else:
        largest = x.abs().amax(-1, keepdim=True)
        scale = (largest if bound is None else largest.clamp_max(bound)) / FP8_MAX
        scale = scale.clamp_min(1.0 / (FP8_MAX * 512.0))
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).float() * scale
