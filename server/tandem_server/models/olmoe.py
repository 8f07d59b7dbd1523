"""OLMoE: the Llama layout with RMSNorms over the whole query and key projections (before the heads split) and
every feed-forward a sparse MoE block."""

from __future__ import annotations

from typing import Any

from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.attention import AttentionBackend
from tandem_server.layers.moe import MoeArgs
from tandem_server.models.decoder import DecoderArgs, DecoderForCausalLM, common_sizes, uniform_layers
from tandem_server.models.moe_config import router_config, stacked_experts, with_sparse_layers
from tandem_server.weights.layout import CheckpointLayout


def olmoe_args(hf: dict[str, Any]) -> DecoderArgs:
    """OLMoE's options: `attention_bias` on all four projections, each expert `intermediate_size` wide, no window."""
    if hf.get("clip_qkv") is not None:
        raise ConfigError(f"clip_qkv ({hf['clip_qkv']}) is not supported; only OLMoE models without it are")
    num_layers = int(hf["num_hidden_layers"])
    sizes = common_sizes(hf)
    attention_bias = bool(hf.get("attention_bias", False))
    return DecoderArgs(
        **sizes,
        layers=with_sparse_layers(uniform_layers(hf, None), (True,) * num_layers),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        qk_norm_over_projection=True,
        moe=MoeArgs(router_config(hf), sizes["intermediate_size"]),
        layout=CheckpointLayout(expert_stacks=stacked_experts(hf)),
    )


class OlmoeForCausalLM(DecoderForCausalLM):
    """Pre-norm decoder with whole-projection q/k norms and sparse MoE feed-forwards."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        super().__init__(olmoe_args(hf_config), parallel, backend)
