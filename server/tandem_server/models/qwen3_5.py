"""Qwen3.5 (`Qwen3_5ForCausalLM`): a hybrid of Gated DeltaNet layers and gated full-attention layers (per
`layer_types`, by default attention every `full_attention_interval`-th layer), each followed by a SwiGLU.

Its attention layers: `q_proj` gives each head its query and an output gate (`sigmoid`), per-head q/k RMSNorms,
partial rotary over rotate-half pairs. Every RMSNorm but the linear attention's gated one scales by `1 + weight`.
The multimodal rotary sections (`mrope_section`) rotate text positions exactly as plain rotary does (all three
position axes equal the token's position), so a text-only shard reads them as plain rotary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.attention import AttentionBackend, AttentionMetadata, AttentionParams, LayerCache
from tandem_server.layers.head_partition import partition_heads
from tandem_server.layers.linear import ColumnParallelLinear, RowParallelLinear, StackedColumns
from tandem_server.layers.norm import RMSNorm
from tandem_server.layers.recurrent.gated_delta_net import DeltaNetArgs, GatedDeltaNet
from tandem_server.layers.recurrent.state_pool import StepStates
from tandem_server.layers.rope_config import RopeConfig
from tandem_server.layers.rotary import RotaryAngles
from tandem_server.models.decoder import (
    DecoderArgs,
    DecoderForCausalLM,
    LayerFactory,
    LayerKind,
    RecurrentLayer,
    common_sizes,
    feed_forward,
)
from tandem_server.weights.layout import CheckpointLayout

QWEN3_5_LAYER_TYPES = ("linear_attention", "full_attention")
DEFAULT_FULL_ATTENTION_INTERVAL = 4
DEFAULT_PARTIAL_ROTARY_FACTOR = 0.25
# Text positions give every multimodal rotary section the same angle: these options change nothing for text.
MULTIMODAL_ROPE_KEYS = ("mrope_section", "mrope_interleaved")


def hybrid_layer_types(hf: dict[str, Any]) -> list[str]:
    """Each layer's kind: `layer_types`, else full attention every `full_attention_interval`-th layer."""
    num_layers = int(hf["num_hidden_layers"])
    layer_types = hf.get("layer_types")
    if layer_types is None:
        interval = int(hf.get("full_attention_interval", DEFAULT_FULL_ATTENTION_INTERVAL))
        layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]
    if len(layer_types) != num_layers:
        raise ConfigError(f"layer_types lists {len(layer_types)} layers, num_hidden_layers is {num_layers}")
    unknown = sorted(set(layer_types) - set(QWEN3_5_LAYER_TYPES))
    if unknown:
        raise ConfigError(f"unsupported layer types {unknown}; supported: {', '.join(QWEN3_5_LAYER_TYPES)}")
    return list(layer_types)


def hybrid_rope(hf: dict[str, Any]) -> RopeConfig:
    """The attention layers' rotary settings, a quarter of each head rotating unless config.json says otherwise."""
    params = {key: value for key, value in (hf.get("rope_parameters") or {}).items() if key not in MULTIMODAL_ROPE_KEYS}
    return RopeConfig.from_hf({"partial_rotary_factor": DEFAULT_PARTIAL_ROTARY_FACTOR, **hf, "rope_parameters": params})


def hybrid_layers(hf: dict[str, Any], sparse: bool = False) -> tuple[LayerKind, ...]:
    """Linear-attention layers are recurrent; every layer's feed-forward is the MoE block when `sparse`."""
    rope = hybrid_rope(hf)
    kinds = hybrid_layer_types(hf)
    return tuple(LayerKind(rope, sparse_mlp=sparse, recurrent=kind == "linear_attention") for kind in kinds)


def qwen3_5_args(hf: dict[str, Any]) -> DecoderArgs:
    """Qwen3.5's sizes: `head_dim` defaults to 256, `attention_bias` covers all four attention projections."""
    bias = bool(hf.get("attention_bias", False))
    return DecoderArgs(
        **common_sizes({"head_dim": 256, **hf}),
        layers=hybrid_layers(hf),
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        norm_unit_offset=True,
        layout=CheckpointLayout(
            fused=DeltaNetArgs.from_hf(hf).fused_tensors("linear_attn"), skipped_prefixes=("mtp.",)
        ),
    )


class GatedAttention(nn.Module):
    """Grouped-query attention whose `q_proj` rows are, per head, its query then its output gate."""

    def __init__(self, args: DecoderArgs, parallel: ParallelContext) -> None:
        super().__init__()
        heads = partition_heads(args.num_heads, args.num_kv_heads, args.head_dim, parallel)
        self.num_heads, self.num_kv_heads, self.head_dim = heads.num_heads, heads.num_kv_heads, args.head_dim
        q_size, kv_size = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
        gated_rows = range(2 * heads.query_features.start, 2 * heads.query_features.stop)
        hidden = args.hidden_size
        self.q_proj = ColumnParallelLinear(hidden, 2 * q_size, args.qkv_bias, parallel, gated_rows)
        self.k_proj = ColumnParallelLinear(hidden, kv_size, args.qkv_bias, parallel, heads.kv_features)
        self.v_proj = ColumnParallelLinear(hidden, kv_size, args.qkv_bias, parallel, heads.kv_features)
        self.o_proj = RowParallelLinear(q_size, hidden, args.o_bias, parallel, heads.query_features)
        self.qkv_proj = StackedColumns((self.q_proj, self.k_proj, self.v_proj))
        self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps, unit_offset=True)
        self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps, unit_offset=True)
        self.params = AttentionParams(args.head_dim**-0.5)

    def forward(
        self,
        hidden: torch.Tensor,
        rotation: RotaryAngles,
        cache: LayerCache,
        metadata: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        tokens = hidden.shape[0]
        query_gate, key, value = self.qkv_proj(hidden)
        query, gate = query_gate.view(tokens, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        query = rotation.rotate(self.q_norm(query))
        key = rotation.rotate(self.k_norm(key.view(tokens, self.num_kv_heads, self.head_dim)))
        value = value.view(tokens, self.num_kv_heads, self.head_dim)
        attended = backend.forward(query, key, value, cache, metadata, self.params)
        return self.o_proj((attended * torch.sigmoid(gate)).reshape(tokens, -1))


class HybridAttentionLayer(nn.Module):
    """Pre-norm gated attention and a pre-norm feed-forward, each with a residual connection."""

    def __init__(self, args: DecoderArgs, kind: LayerKind, parallel: ParallelContext) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, unit_offset=True)
        self.self_attn = GatedAttention(args, parallel)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, unit_offset=True)
        self.mlp = feed_forward(args, kind, parallel)

    def forward(
        self,
        hidden: torch.Tensor,
        rotation: RotaryAngles,
        cache: LayerCache,
        metadata: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), rotation, cache, metadata, backend)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LinearAttentionLayer(RecurrentLayer):
    """Pre-norm Gated DeltaNet and a pre-norm feed-forward, each with a residual connection."""

    def __init__(self, args: DecoderArgs, kind: LayerKind, delta_net: DeltaNetArgs, parallel: ParallelContext) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, unit_offset=True)
        self.linear_attn = GatedDeltaNet(delta_net, parallel)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, unit_offset=True)
        self.mlp = feed_forward(args, kind, parallel)
        self.state_shapes = self.linear_attn.state_shapes
        self.state_dtypes = self.linear_attn.state_dtypes

    def forward(
        self, hidden: torch.Tensor, query_lens: Sequence[int], states: StepStates | None, state_layer: int
    ) -> torch.Tensor:
        hidden = hidden + self.linear_attn(self.input_layernorm(hidden), query_lens, states, state_layer)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


def hybrid_layer_factory(delta_net: DeltaNetArgs) -> LayerFactory:
    """A Gated DeltaNet layer where `layer_types` says `linear_attention`, else a gated attention layer."""

    def layer(args: DecoderArgs, kind: LayerKind, parallel: ParallelContext) -> nn.Module:
        if kind.recurrent:
            return LinearAttentionLayer(args, kind, delta_net, parallel)
        return HybridAttentionLayer(args, kind, parallel)

    return layer


class Qwen3_5ForCausalLM(DecoderForCausalLM):
    """Qwen3.5's dense hybrid decoder (text only; multi-token prediction layers are not loaded)."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        layers = hybrid_layer_factory(DeltaNetArgs.from_hf(hf_config))
        super().__init__(qwen3_5_args(hf_config), parallel, backend, layers)
