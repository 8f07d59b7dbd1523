"""What the MoE families read alike from config.json: the router, which layers are sparse, and the layout of
transformers' own stacked expert tensors."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tandem_server.errors import ConfigError
from tandem_server.layers.moe import MoeArgs, RouterConfig
from tandem_server.layers.moe.routing import GroupedTopK
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


def grouped_moe_args(hf: dict[str, Any]) -> MoeArgs:
    """DeepSeek-V3's and GLM-4.5's MoE block: the grouped sigmoid router (`n_group`, `topk_group`,
    `routed_scaling_factor`, `norm_topk_prob`) and `n_shared_experts` always-on shared experts; `hf` has the family's
    defaults filled in."""
    grouped = GroupedTopK(int(hf["n_group"]), int(hf["topk_group"]), float(hf["routed_scaling_factor"]))
    experts = num_experts(hf)
    if experts < 1:
        raise ConfigError(f"{hf['architectures'][0]} needs n_routed_experts of at least 1")
    router = RouterConfig(experts, int(hf["num_experts_per_tok"]), bool(hf["norm_topk_prob"]), grouped)
    intermediate = int(hf["moe_intermediate_size"])
    shared = intermediate * int(hf["n_shared_experts"] or 0)
    return MoeArgs(router, intermediate, shared_experts_intermediate_size=shared)


def after_first_dense(hf: dict[str, Any]) -> tuple[bool, ...]:
    """DeepSeek-V3's and GLM-4.5's rule: the first `first_k_dense_replace` layers are dense, the rest sparse."""
    num_layers = int(hf["num_hidden_layers"])
    first_sparse = int(hf["first_k_dense_replace"] or 0)
    return tuple(layer >= first_sparse for layer in range(num_layers))


def prediction_layer_prefixes(hf: dict[str, Any]) -> tuple[str, ...]:
    """The checkpoint names of the multi-token prediction layers published checkpoints append after the decoder
    (`num_nextn_predict_layers` of them, numbered from `num_hidden_layers`), which serving never runs."""
    num_layers = int(hf["num_hidden_layers"])
    extra = int(hf["num_nextn_predict_layers"] or 0)
    return tuple(f"model.layers.{layer}." for layer in range(num_layers, num_layers + extra))
