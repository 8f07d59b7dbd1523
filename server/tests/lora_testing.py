"""Test helpers: PEFT-layout LoRA adapters of random weights written for a tiny Llama, the reference with an adapter
merged into its weights by hand (W + scale * B @ A), and greedy tokens of a transformers model."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import PreTrainedModel

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class AdapterSpec:
    """A random adapter: its rank, alpha, the modules it changes, in which layers (None: every layer)."""

    rank: int
    alpha: float
    targets: tuple[str, ...]
    use_rslora: bool = False
    layers: tuple[int, ...] | None = None
    seed: int = 0
    # Extra or replaced adapter_config.json entries.
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


# Rank 8 on the value and down projections only (q/k rows of the fused qkv stay unchanged), and rank 16 with rsLoRA
# on every projection.
VALUES = AdapterSpec(rank=8, alpha=16, targets=("v_proj", "down_proj"), seed=1)
EVERYTHING = AdapterSpec(
    rank=16,
    alpha=8,
    targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    use_rslora=True,
    seed=2,
)


def projection(model: PreTrainedModel, layer: int, module: str) -> nn.Linear:
    block = model.model.layers[layer]
    return getattr(block.self_attn if module in ATTENTION_MODULES else block.mlp, module)


def tensor_prefix(layer: int, module: str) -> str:
    group = "self_attn" if module in ATTENTION_MODULES else "mlp"
    return f"base_model.model.model.layers.{layer}.{group}.{module}"


def write_adapter(directory: Path, reference: PreTrainedModel, spec: AdapterSpec) -> Path:
    """Writes `adapter_config.json` and `adapter_model.safetensors` as PEFT saves them; B is random too (PEFT
    starts it at zero, which would hide a delta never applied)."""
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(spec.seed)
    layers = spec.layers if spec.layers is not None else range(reference.config.num_hidden_layers)
    tensors = {}
    for layer in layers:
        for module in spec.targets:
            linear = projection(reference, layer, module)
            prefix = tensor_prefix(layer, module)
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(spec.rank, linear.in_features, generator=generator) * 0.3
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(linear.out_features, spec.rank, generator=generator) * 0.3
    save_file(tensors, directory / "adapter_model.safetensors")
    config = {
        "peft_type": "LORA",
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "use_rslora": spec.use_rslora,
        "target_modules": list(spec.targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        **spec.config,
    }
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory


def merged(reference: PreTrainedModel, directory: Path, spec: AdapterSpec) -> PreTrainedModel:
    """A copy of `reference` with the adapter in `directory` merged into its weights: W + scale * B @ A."""
    model = copy.deepcopy(reference)
    tensors = load_file(directory / "adapter_model.safetensors")
    layers = spec.layers if spec.layers is not None else range(model.config.num_hidden_layers)
    with torch.no_grad():
        for layer in layers:
            for module in spec.targets:
                prefix = tensor_prefix(layer, module)
                a, b = tensors[f"{prefix}.lora_A.weight"], tensors[f"{prefix}.lora_B.weight"]
                projection(model, layer, module).weight.add_(spec.scaling * (b.double() @ a.double()).float())
    return model


@torch.no_grad()
def greedy(model: PreTrainedModel, prompt: list[int], max_new_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens of `model` after `prompt`, with the last-position logits of each draw."""
    tokens = list(prompt)
    logits = []
    for _ in range(max_new_tokens):
        last = model(torch.tensor([tokens])).logits[0, -1].float()
        logits.append(last)
        tokens.append(int(last.argmax()))
    return tokens[len(prompt) :], logits
