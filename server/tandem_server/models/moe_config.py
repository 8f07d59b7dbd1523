"""What the MoE families read alike from config.json: the router, which layers are sparse, and the layout of
transformers' own stacked expert tensors."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tandem_server.errors import ConfigError
from tandem_server.layers.moe import RouterConfig
from tandem_server.models.config import num_experts
from tandem_server.models.decoder import LayerKind
from tandem_server.weights.layout import ExpertStack


def router_config(hf: dict[str, Any], normalize_top_k: bool | None = None) -> RouterConfig:
    """The softmax top-k router; `normalize_top_k` None reads `norm_topk_prob` (default off)."""
    experts = num_experts(hf)
    if experts < 1:
        raise ConfigError(f"{hf['architectures'][0]} needs num_experts (or num_local_experts) of at least 1")
    normalize = bool(hf.get("norm_topk_prob", False)) if normalize_top_k is None else normalize_top_k
    return RouterConfig(experts, int(hf["num_experts_per_tok"]), normalize)


def qwen_sparse_layers(hf: dict[str, Any]) -> tuple[bool, ...]:
    """Qwen-MoE's rule: every `decoder_sparse_step`-th layer is sparse, except those in `mlp_only_layers`."""
    num_layers = int(hf["num_hidden_layers"])
    step = int(hf.get("decoder_sparse_step") or 1)
    dense = {int(layer) for layer in hf.get("mlp_only_layers") or ()}
    outside = sorted(layer for layer in dense if not 0 <= layer < num_layers)
    if outside:
        raise ConfigError(f"mlp_only_layers names layers {outside}; the model has {num_layers}")
    return tuple(layer not in dense and (layer + 1) % step == 0 for layer in range(num_layers))


def with_sparse_layers(layers: tuple[LayerKind, ...], sparse: tuple[bool, ...]) -> tuple[LayerKind, ...]:
    """`layers` with each one's feed-forward kind set from `sparse`."""
    return tuple(replace(kind, sparse_mlp=flag) for kind, flag in zip(layers, sparse, strict=True))


def stacked_experts(hf: dict[str, Any]) -> tuple[ExpertStack, ...]:
    """How transformers 5 holds a layer's experts in memory, which a checkpoint saved from its state dict keeps:
    `mlp.experts.gate_up_proj [experts, 2 * intermediate, hidden]` (gate rows first) and
    `mlp.experts.down_proj [experts, hidden, intermediate]`, split into the per-expert parameters that
    save_pretrained and the published checkpoints write."""
    experts = num_experts(hf)
    expert = "mlp.experts.{expert}."
    return (
        ExpertStack("mlp.experts.gate_up_proj", experts, (expert + "gate_proj.weight", expert + "up_proj.weight")),
        ExpertStack("mlp.experts.down_proj", experts, (expert + "down_proj.weight",)),
    )
