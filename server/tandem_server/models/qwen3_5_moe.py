"""Qwen3.5-MoE (`Qwen3_5MoeForCausalLM`): Qwen3.5's hybrid layers, every feed-forward an MoE block of
`moe_intermediate_size` experts (top-k weights always renormalised) beside a shared expert scaled by
`sigmoid(shared_expert_gate(x))`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tandem_server.distributed import ParallelContext
from tandem_server.layers.attention import AttentionBackend
from tandem_server.layers.recurrent.gated_delta_net import DeltaNetArgs
from tandem_server.models.decoder import DecoderArgs, DecoderForCausalLM
from tandem_server.models.moe_config import stacked_experts
from tandem_server.models.qwen3_5 import hybrid_layer_factory, qwen3_5_args
from tandem_server.models.qwen3_next import gated_shared_expert_moe


def qwen3_5_moe_args(config: dict[str, Any]) -> DecoderArgs:
    """Qwen3.5's sizes and layer kinds, every layer sparse; config.json has no dense `intermediate_size` (no layer
    builds a dense MLP, so the experts' width stands in for it)."""
    hf = {**config, "intermediate_size": config.get("intermediate_size") or config["moe_intermediate_size"]}
    dense = qwen3_5_args(hf)
    return replace(
        dense,
        layers=tuple(replace(kind, sparse_mlp=True) for kind in dense.layers),
        moe=gated_shared_expert_moe(hf, normalize_top_k=True),
        layout=replace(dense.layout, expert_stacks=stacked_experts(hf)),
    )


class Qwen3_5MoeForCausalLM(DecoderForCausalLM):
    """Qwen3.5's hybrid decoder with sparse MoE feed-forwards that include a gated shared expert."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        layers = hybrid_layer_factory(DeltaNetArgs.from_hf(hf_config))
        super().__init__(qwen3_5_moe_args(hf_config), parallel, backend, layers)
