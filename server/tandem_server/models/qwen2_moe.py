"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention; sparse layers add to the routed experts an always-on
shared expert scaled by `sigmoid(shared_expert_gate(x))`."""

from __future__ import annotations

from typing import Any

from tandem_server.distributed import ParallelContext
from tandem_server.layers.attention import AttentionBackend
from tandem_server.layers.moe import MoeArgs
from tandem_server.models.decoder import DecoderArgs, DecoderForCausalLM, common_sizes, uniform_layers
from tandem_server.models.moe_config import qwen_sparse_layers, router_config, stacked_experts, with_sparse_layers
from tandem_server.models.qwen2 import qwen_windows
from tandem_server.weights.layout import CheckpointLayout


def qwen2_moe_args(hf: dict[str, Any]) -> DecoderArgs:
    """Qwen2-MoE's options: q/k/v biases (`qkv_bias`, on unless turned off), `moe_intermediate_size` experts, a
    `shared_expert_intermediate_size` shared expert, dense `intermediate_size` MLPs on the other layers."""
    return DecoderArgs(
        **common_sizes(hf),
        layers=with_sparse_layers(uniform_layers(hf, qwen_windows(hf)), qwen_sparse_layers(hf)),
        qkv_bias=bool(hf.get("qkv_bias", True)),
        moe=MoeArgs(
            router_config(hf),
            int(hf["moe_intermediate_size"]),
            shared_intermediate_size=int(hf.get("shared_expert_intermediate_size") or 0),
        ),
        layout=CheckpointLayout(expert_stacks=stacked_experts(hf)),
    )


class Qwen2MoeForCausalLM(DecoderForCausalLM):
    """Qwen2's decoder with sparse MoE feed-forwards that include a gated shared expert."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        super().__init__(qwen2_moe_args(hf_config), parallel, backend)
