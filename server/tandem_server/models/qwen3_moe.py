"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention with per-head q/k norms; sparse layers per
`decoder_sparse_step` and `mlp_only_layers`, top-k renormalised per `norm_topk_prob`."""

from __future__ import annotations

from typing import Any

from tandem_server.distributed import ParallelContext
from tandem_server.layers.attention import AttentionBackend
from tandem_server.layers.moe import MoeArgs
from tandem_server.models.decoder import DecoderArgs, DecoderForCausalLM, common_sizes, uniform_layers
from tandem_server.models.moe_config import qwen_sparse_layers, router_config, stacked_experts, with_sparse_layers
from tandem_server.weights.layout import CheckpointLayout


def qwen3_moe_args(hf: dict[str, Any]) -> DecoderArgs:
    """Qwen3-MoE's options; `sliding_window` applies to every layer, and only with `use_sliding_window`."""
    num_layers = int(hf["num_hidden_layers"])
    window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
    attention_bias = bool(hf.get("attention_bias", False))
    layers = uniform_layers(hf, (int(window),) * num_layers if window else None)
    return DecoderArgs(
        **common_sizes(hf),
        layers=with_sparse_layers(layers, qwen_sparse_layers(hf)),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        qk_norm=True,
        moe=MoeArgs(router_config(hf), int(hf["moe_intermediate_size"])),
        layout=CheckpointLayout(expert_stacks=stacked_experts(hf)),
    )


class Qwen3MoeForCausalLM(DecoderForCausalLM):
    """Qwen3's decoder with sparse MoE feed-forwards."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        super().__init__(qwen3_moe_args(hf_config), parallel, backend)
