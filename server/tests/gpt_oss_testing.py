"""Tiny random gpt-oss checkpoints: float ones as transformers saves them, and MXFP4 ones as published (the experts'
weights quantized by a small MXFP4 quantizer, the reference given the dequantized values)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from shard_testing import TINY_SETTINGS
from transformers import GptOssConfig, GptOssForCausalLM
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

# Three layers (sliding, full, sliding) with a window shorter than the test sequences; an odd expert count, top-3;
# YaRN over a pretraining context the sequences run past; a clamp low enough that some gate and up values reach it.
GPT_OSS_SETTINGS: dict[str, Any] = {
    **TINY_SETTINGS,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "head_dim": 16,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "sliding_window": 4,
    "num_local_experts": 5,
    "num_experts_per_tok": 3,
    "swiglu_limit": 1.0,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 8,
        "beta_fast": 4.0,
        "truncate": False,
    },
}
# The E2M1 values in code order (sign bit, two exponent bits, one mantissa bit).
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
# The quantized projections, their stacks in transformers' `[experts, in, out]` layout.
EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")


def gpt_oss_reference(seed: int = 0, **overrides: Any) -> GptOssForCausalLM:
    """A random tiny gpt-oss, every bias, norm weight and sink randomised (their inits are constant or small), the
    sinks large enough to take much of each attention row's weight."""
    torch.manual_seed(seed)
    config = GptOssConfig(**{**GPT_OSS_SETTINGS, **overrides})
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    reference = GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.2)
            elif name.endswith("bias"):
                param.copy_(torch.randn_like(param) * 0.2)
            elif name.endswith("sinks"):
                param.copy_(torch.randn_like(param) * 2.0)
    return reference


def write_gpt_oss(path: Path, seed: int = 0, **overrides: Any) -> GptOssForCausalLM:
    """Saves a random tiny gpt-oss (float, transformers' layout) into `path` and returns it as the reference."""
    reference = gpt_oss_reference(seed, **overrides)
    reference.save_pretrained(path)
    return reference


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`weight [..., rows, columns]` as MXFP4 `(blocks [..., rows, columns / 32, 16], scales [..., rows,
    columns / 32])`: each run of 32 values scaled by the smallest power of two that fits it in E2M1's range, each
    value rounded to the nearest E2M1 value."""
    groups = weight.float().unflatten(-1, (-1, 32))
    largest = groups.abs().amax(dim=-1)
    exponent = torch.where(largest > 0, torch.ceil(torch.log2(largest / 6.0)), torch.tensor(-127.0))
    exponent = exponent.clamp(-127, 127)
    scaled = groups / torch.exp2(exponent).unsqueeze(-1)
    codes = (scaled.unsqueeze(-1) - E2M1).abs().argmin(dim=-1)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.to(torch.uint8), (exponent + 127).to(torch.uint8)


def write_gpt_oss_mxfp4(path: Path, seed: int = 0, **overrides: Any) -> GptOssForCausalLM:
    """Saves a random tiny gpt-oss as published, its experts' weights MXFP4 blocks and scales, and returns the
    reference holding the dequantized weights (dequantized by transformers' own MXFP4 reader)."""
    reference = gpt_oss_reference(seed, **overrides)
    tensors: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if not name.endswith(EXPERT_WEIGHTS):
                tensors[name] = param.detach().contiguous()
                continue
            # Published rows are output features: the transpose of transformers' `[experts, in, out]`.
            blocks, scales = quantize_mxfp4(param.transpose(1, 2))
            tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
            param.copy_(convert_moe_packed_tensors(blocks, scales, dtype=param.dtype))
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    config = {**reference.config.to_dict(), "architectures": ["GptOssForCausalLM"]}
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens"],
    }
    (path / "config.json").write_text(json.dumps(config))
    return reference
