"""LFM2-MoE (`Lfm2MoeForCausalLM`): LFM2's gated short-convolution and attention layers, the first
`num_dense_layers` with LFM2's SwiGLU (`intermediate_size`, not adjusted as LFM2's `block_ff_dim` is), the rest with an
MoE block of `num_experts` SwiGLU experts of `moe_intermediate_size`.

The router scores experts by `sigmoid(logits)`; with `use_expert_bias` the top `num_experts_per_tok` are chosen by
the scores plus the checkpoint's `expert_bias` (which only chooses), and the chosen experts' unbiased scores are the
weights, renormalised to sum to one when `norm_topk_prob` (epsilon 1e-6, as the reference), times
`routed_scaling_factor`: the grouped sigmoid router's one-group case. No shared expert.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.attention import AttentionBackend
from tandem_server.layers.moe import MoeArgs, RouterConfig
from tandem_server.layers.moe.routing import GroupedTopK
from tandem_server.models.decoder import DecoderArgs, DecoderForCausalLM
from tandem_server.models.lfm2 import ConvArgs, lfm2_args, lfm2_layers
from tandem_server.models.moe_config import stacked_experts, with_sparse_layers
from tandem_server.weights.layout import Renamed

# The reference's renormalisation epsilon.
LFM2_MOE_NORMALIZE_EPSILON = 1e-6

# Checkpoint names of the MoE blocks (published per expert, or stacked as transformers 5 holds them) -> the MoE
# block's.
_MOE_RENAMES = (
    Renamed(r"\.feed_forward\.gate\.weight$", ".mlp.gate.weight"),
    Renamed(r"\.feed_forward\.expert_bias$", ".mlp.gate.e_score_correction_bias"),
    Renamed(r"\.feed_forward\.experts\.(\d+)\.w1\.", r".mlp.experts.\1.gate_proj."),
    Renamed(r"\.feed_forward\.experts\.(\d+)\.w3\.", r".mlp.experts.\1.up_proj."),
    Renamed(r"\.feed_forward\.experts\.(\d+)\.w2\.", r".mlp.experts.\1.down_proj."),
    Renamed(r"\.feed_forward\.experts\.(gate_up_proj|down_proj)$", r".mlp.experts.\1"),
)


def lfm2_moe_sparse_layers(hf: dict[str, Any]) -> tuple[bool, ...]:
    """Whether each layer's feed-forward is an MoE block: every layer after the first `num_dense_layers`."""
    num_layers, dense = int(hf["num_hidden_layers"]), int(hf.get("num_dense_layers", 2))
    if not 0 <= dense <= num_layers:
        raise ConfigError(f"num_dense_layers is {dense}; the model has {num_layers} layers")
    return tuple(layer >= dense for layer in range(num_layers))


def lfm2_moe_args(hf: dict[str, Any]) -> DecoderArgs:
    """LFM2's args with the dense width `intermediate_size` as given and MoE blocks after the dense layers."""
    experts = int(hf.get("num_experts", 32))
    grouped = GroupedTopK(
        num_groups=1,
        top_groups=1,
        scaling_factor=float(hf.get("routed_scaling_factor", 1.0)),
        correction_bias=bool(hf.get("use_expert_bias", True)),
        normalize_epsilon=LFM2_MOE_NORMALIZE_EPSILON,
    )
    router = RouterConfig(experts, int(hf.get("num_experts_per_tok", 4)), bool(hf.get("norm_topk_prob", True)), grouped)
    moe = MoeArgs(router, int(hf.get("moe_intermediate_size", 1792)))
    args = lfm2_args({**hf, "block_ff_dim": None, "block_auto_adjust_ff_dim": False})
    layout = args.layout
    layout = replace(
        layout,
        renamed=(*layout.renamed, *_MOE_RENAMES),
        expert_stacks=stacked_experts({**hf, "num_experts": experts}),
    )
    return replace(args, layers=with_sparse_layers(args.layers, lfm2_moe_sparse_layers(hf)), moe=moe, layout=layout)


class Lfm2MoeForCausalLM(DecoderForCausalLM):
    """LFM2-MoE's hybrid decoder (tied embeddings by default)."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        layers = lfm2_layers(ConvArgs.from_hf(hf_config))
        super().__init__(lfm2_moe_args(hf_config), parallel, backend, layers)
