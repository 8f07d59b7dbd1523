"""Qwen3-Next (`Qwen3NextForCausalLM`): Qwen3.5's hybrid of Gated DeltaNet and gated attention layers, with MoE
feed-forwards whose always-on shared expert is scaled by `sigmoid(shared_expert_gate(x))` (dense MLPs on
`mlp_only_layers` and between every `decoder_sparse_step`-th layer). Its checkpoint keeps each key head's query, key,
values and gates together in `in_proj_qkvz`, and its b and a in `in_proj_ba`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tandem_server.distributed import ParallelContext
from tandem_server.layers.attention import AttentionBackend
from tandem_server.layers.moe import MoeArgs
from tandem_server.layers.recurrent.gated_delta_net import DeltaNetArgs
from tandem_server.models.decoder import DecoderArgs, DecoderForCausalLM
from tandem_server.models.moe_config import qwen_sparse_layers, router_config, stacked_experts, with_sparse_layers
from tandem_server.models.qwen3_5 import hybrid_layer_factory, qwen3_5_args
from tandem_server.weights.layout import CheckpointLayout


def gated_shared_expert_moe(hf: dict[str, Any], normalize_top_k: bool) -> MoeArgs:
    """`moe_intermediate_size` experts behind a softmax top-k router and a `shared_expert_intermediate_size` shared
    expert scaled by `sigmoid(shared_expert_gate(x))` (Qwen3-Next's and Qwen3.5-MoE's block)."""
    return MoeArgs(
        router_config(hf, normalize_top_k=normalize_top_k),
        int(hf["moe_intermediate_size"]),
        shared_intermediate_size=int(hf.get("shared_expert_intermediate_size") or 0),
    )


def qwen3_next_args(hf: dict[str, Any]) -> DecoderArgs:
    """Qwen3.5's sizes and layer kinds with the gated-shared-expert MoE block (top-k weights renormalised unless
    `norm_topk_prob` is off)."""
    dense = qwen3_5_args(hf)
    moe = gated_shared_expert_moe(hf, normalize_top_k=bool(hf.get("norm_topk_prob", True)))
    layout = CheckpointLayout(
        fused=DeltaNetArgs.from_hf(hf, grouped_projections=True).fused_tensors("linear_attn"),
        expert_stacks=stacked_experts(hf),
        skipped_prefixes=("mtp.",),
    )
    return replace(dense, layers=with_sparse_layers(dense.layers, qwen_sparse_layers(hf)), moe=moe, layout=layout)


class Qwen3NextForCausalLM(DecoderForCausalLM):
    """Qwen3-Next's hybrid decoder with sparse MoE feed-forwards that include a gated shared expert."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        layers = hybrid_layer_factory(DeltaNetArgs.from_hf(hf_config, grouped_projections=True))
        super().__init__(qwen3_next_args(hf_config), parallel, backend, layers)
