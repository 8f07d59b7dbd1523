"""GLM-4 (0414): norms after both blocks as well as before, partial rotary over interleaved pairs, q/k/v biases,
and a fused `gate_up_proj` split at load time."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from tandem_server.distributed import ParallelContext
from tandem_server.layers.attention import AttentionBackend
from tandem_server.layers.norm import RMSNorm
from tandem_server.layers.rope_config import RopeConfig
from tandem_server.layers.rotary import RotaryAngles
from tandem_server.models.decoder import (
    DecoderArgs,
    DecoderAttention,
    DecoderForCausalLM,
    LayerKind,
    QueryKeyValue,
    StagedLayer,
    common_sizes,
    dense_mlp,
)
from tandem_server.weights.layout import CheckpointLayout, FusedTensor

DEFAULT_PARTIAL_ROTARY_FACTOR = 0.5


def glm4_args(hf: dict[str, Any]) -> DecoderArgs:
    """GLM-4's options: `attention_bias` (on by default) covers q/k/v only; half of each head rotates by default."""
    sizes = common_sizes(hf)
    intermediate = sizes["intermediate_size"]
    layout = CheckpointLayout(
        fused=(
            FusedTensor(
                "mlp.gate_up_proj.weight",
                (("mlp.gate_proj.weight", intermediate), ("mlp.up_proj.weight", intermediate)),
            ),
        )
    )
    rope = RopeConfig.from_hf({"partial_rotary_factor": DEFAULT_PARTIAL_ROTARY_FACTOR, **hf})
    layers = (LayerKind(replace(rope, interleaved=True)),) * int(hf["num_hidden_layers"])
    return DecoderArgs(**sizes, layers=layers, qkv_bias=bool(hf.get("attention_bias", True)), layout=layout)


class Glm4DecoderLayer(StagedLayer):
    """Attention and MLP blocks, each normalised on the way in and on the way out, with residuals."""

    def __init__(self, args: DecoderArgs, kind: LayerKind, parallel: ParallelContext) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = DecoderAttention(args, kind, parallel)
        self.post_self_attn_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = dense_mlp(args, parallel)
        self.post_mlp_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def attention_inputs(self, hidden: torch.Tensor, rotation: RotaryAngles) -> QueryKeyValue:
        return self.self_attn.project(self.input_layernorm(hidden), rotation)

    def after_attention(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.post_self_attn_layernorm(self.self_attn.output(attended))
        return hidden + self.post_mlp_layernorm(self.mlp(self.post_attention_layernorm(hidden)))


class Glm4ForCausalLM(DecoderForCausalLM):
    """GLM-4's dense decoder."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        super().__init__(glm4_args(hf_config), parallel, backend, Glm4DecoderLayer)
