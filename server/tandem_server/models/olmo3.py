"""OLMo 3: norms after both blocks only (none before), RMSNorm over the whole query and key projections, sliding
and full-attention layers with their own rotary tables."""

from __future__ import annotations

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
    windows_from_layer_types,
)

DEFAULT_ROPE_THETA = 500_000.0
DEFAULT_SLIDING_WINDOW = 4096
# Without `layer_types`, every fourth layer attends fully and the others slide.
FULL_ATTENTION_INTERVAL = 4


def olmo3_args(hf: dict[str, Any]) -> DecoderArgs:
    """OLMo 3's options: `attention_bias` covers all four attention projections."""
    attention_bias = bool(hf.get("attention_bias", False))
    return DecoderArgs(
        **common_sizes(hf),
        layers=_layers(hf),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        qk_norm_over_projection=True,
    )


def _layers(hf: dict[str, Any]) -> tuple[LayerKind, ...]:
    windows = windows_from_layer_types(hf)
    if windows is None:
        window = int(hf.get("sliding_window") or DEFAULT_SLIDING_WINDOW)
        num_layers = int(hf["num_hidden_layers"])
        windows = tuple(None if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else window for i in range(num_layers))
    full_rope, sliding_rope = _ropes(hf)
    return tuple(LayerKind(sliding_rope if window else full_rope, window) for window in windows)


def _ropes(hf: dict[str, Any]) -> tuple[RopeConfig, RopeConfig]:
    """Full-attention and sliding layers' rotary parameters: nested by layer type in saved configs; in Hub configs
    `rope_theta` applies to both and `rope_scaling` to full-attention layers only."""
    nested = hf.get("rope_parameters") or {}
    context = {"max_position_embeddings": hf.get("max_position_embeddings")}
    theta = {"rope_theta": nested.get("rope_theta", hf.get("rope_theta", DEFAULT_ROPE_THETA))}
    if isinstance(nested.get("full_attention"), dict) or isinstance(nested.get("sliding_attention"), dict):
        full = {**theta, **(nested.get("full_attention") or {})}
        sliding = {**theta, **(nested.get("sliding_attention") or {})}
        return (
            RopeConfig.from_hf({**context, "rope_parameters": full}),
            RopeConfig.from_hf({**context, "rope_parameters": sliding}),
        )
    return RopeConfig.from_hf({**theta, **hf}), RopeConfig.from_hf({**context, "rope_parameters": theta})


class Olmo3DecoderLayer(StagedLayer):
    """Attention and MLP blocks on the raw residual stream, each normalised on the way out."""

    def __init__(self, args: DecoderArgs, kind: LayerKind, parallel: ParallelContext) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(args, kind, parallel)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = dense_mlp(args, parallel)
        self.post_feedforward_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def attention_inputs(self, hidden: torch.Tensor, rotation: RotaryAngles) -> QueryKeyValue:
        return self.self_attn.project(hidden, rotation)

    def after_attention(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.post_attention_layernorm(self.self_attn.output(attended))
        return hidden + self.post_feedforward_layernorm(self.mlp(hidden))


class Olmo3ForCausalLM(DecoderForCausalLM):
    """OLMo 3's decoder, on one rank only: its query and key norms span every head, which ranks split."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        super().__init__(olmo3_args(hf_config), parallel, backend, Olmo3DecoderLayer)
