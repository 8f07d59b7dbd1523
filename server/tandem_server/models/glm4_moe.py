"""GLM-4.5 and GLM-4.6 (`Glm4MoeForCausalLM`): Llama-layout layers with partial rotary over rotate-half pairs and
optional per-head q/k norms; the first `first_k_dense_replace` layers dense, the others MoE blocks with grouped
sigmoid routing and shared experts."""

from __future__ import annotations

from typing import Any

from tandem_server.distributed import ParallelContext
from tandem_server.layers.attention import AttentionBackend
from tandem_server.layers.rope_config import RopeConfig
from tandem_server.models.decoder import DecoderArgs, DecoderForCausalLM, LayerKind, common_sizes
from tandem_server.models.moe_config import (
    after_first_dense,
    grouped_moe_args,
    prediction_layer_prefixes,
    stacked_experts,
    with_sparse_layers,
)
from tandem_server.weights.layout import CheckpointLayout

# transformers' defaults for the options config.json may leave out.
CONFIG_DEFAULTS: dict[str, Any] = {
    "partial_rotary_factor": 0.5,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 1.0,
    "norm_topk_prob": True,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "num_nextn_predict_layers": 1,
}


def glm4_moe_args(config: dict[str, Any]) -> DecoderArgs:
    """GLM-4.5's options: `attention_bias` covers q/k/v only; half of each head rotates unless the rope parameters
    say otherwise; `use_qk_norm` normalises each head's queries and keys."""
    hf = {**CONFIG_DEFAULTS, **config}
    rope = RopeConfig.from_hf(hf)
    layers = (LayerKind(rope),) * int(hf["num_hidden_layers"])
    return DecoderArgs(
        **common_sizes(hf),
        layers=with_sparse_layers(layers, after_first_dense(hf)),
        qkv_bias=bool(hf.get("attention_bias", False)),
        qk_norm=bool(hf.get("use_qk_norm", False)),
        moe=grouped_moe_args(hf),
        layout=CheckpointLayout(skipped_prefixes=prediction_layer_prefixes(hf), expert_stacks=stacked_experts(hf)),
    )


class Glm4MoeForCausalLM(DecoderForCausalLM):
    """GLM-4.5's decoder with grouped-routing MoE feed-forwards after its first dense layers."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        super().__init__(glm4_moe_args(hf_config), parallel, backend)
