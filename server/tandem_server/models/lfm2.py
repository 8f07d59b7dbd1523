"""LFM2: a hybrid of gated short-convolution layers and grouped-query attention layers (per `layer_types`), each
followed by a SwiGLU feed-forward; per-head q/k norms; the final norm is the checkpoint's `embedding_norm`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.interfaces.context import served_positions
from tandem_server.layers.attention import AttentionBackend
from tandem_server.layers.norm import RMSNorm
from tandem_server.layers.recurrent.short_conv import ShortConv
from tandem_server.layers.recurrent.state_pool import StepStates
from tandem_server.layers.rope_config import RopeConfig
from tandem_server.models.decoder import (
    DecoderArgs,
    DecoderForCausalLM,
    DecoderLayer,
    LayerFactory,
    LayerKind,
    RecurrentLayer,
    feed_forward,
)
from tandem_server.weights.layout import CheckpointLayout, FusedTensor, Renamed

LFM2_LAYER_TYPES = ("conv", "full_attention")
DEFAULT_CONV_KERNEL = 3
DEFAULT_ROPE_THETA = 1_000_000.0

# Checkpoint names -> the shared decoder's parameter names.
_RENAMES = (
    Renamed(r"\.operator_norm\.", ".input_layernorm."),
    Renamed(r"\.ffn_norm\.", ".post_attention_layernorm."),
    Renamed(r"\.feed_forward\.w1\.", ".mlp.gate_proj."),
    Renamed(r"\.feed_forward\.w3\.", ".mlp.up_proj."),
    Renamed(r"\.feed_forward\.w2\.", ".mlp.down_proj."),
    Renamed(r"\.self_attn\.out_proj\.", ".self_attn.o_proj."),
    Renamed(r"\.self_attn\.q_layernorm\.", ".self_attn.q_norm."),
    Renamed(r"\.self_attn\.k_layernorm\.", ".self_attn.k_norm."),
    Renamed(r"\.conv\.conv\.(weight|bias)$", r".conv.conv_\1"),
    Renamed(r"^model\.embedding_norm\.", "model.norm."),
)


def lfm2_layer_types(hf: dict[str, Any]) -> list[str]:
    """Each layer's kind: `layer_types`, or (older configs) attention at `full_attn_idxs`, convolution elsewhere."""
    num_layers = int(hf["num_hidden_layers"])
    layer_types = hf.get("layer_types")
    if layer_types is None:
        attention = set(hf.get("full_attn_idxs") or range(num_layers))
        layer_types = ["full_attention" if i in attention else "conv" for i in range(num_layers)]
    if len(layer_types) != num_layers:
        raise ConfigError(f"layer_types lists {len(layer_types)} layers, num_hidden_layers is {num_layers}")
    unknown = sorted(set(layer_types) - set(LFM2_LAYER_TYPES))
    if unknown:
        raise ConfigError(f"unsupported LFM2 layer types {unknown}; supported: {', '.join(LFM2_LAYER_TYPES)}")
    return list(layer_types)


def lfm2_intermediate_size(hf: dict[str, Any]) -> int:
    """The feed-forward width: `block_auto_adjust_ff_dim` takes two thirds of it, times `block_ffn_dim_multiplier`,
    rounded up to a multiple of `block_multiple_of`."""
    size = int(hf.get("block_ff_dim") or hf["intermediate_size"])
    if not hf.get("block_auto_adjust_ff_dim", True):
        return size
    size = int(2 * size / 3)
    multiplier = hf.get("block_ffn_dim_multiplier", 1.0)
    if multiplier is not None:
        multiple_of = int(hf.get("block_multiple_of", 256))
        size = int(multiplier * size)
        size = multiple_of * ((size + multiple_of - 1) // multiple_of)
    return size


def lfm2_args(hf: dict[str, Any]) -> DecoderArgs:
    """LFM2's sizes and layer kinds; `norm_eps`, `block_ff_dim` and `tie_embedding` are its spellings."""
    hidden_size, num_heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    rope = RopeConfig.from_hf({"rope_theta": DEFAULT_ROPE_THETA, **hf})
    layers = tuple(LayerKind(rope, recurrent=kind == "conv") for kind in lfm2_layer_types(hf))
    tied = hf.get("tie_embedding", hf.get("tie_word_embeddings", True))
    conv_bias = ConvArgs.from_hf(hf).bias
    in_proj_parts = tuple((f"conv.{part}_proj.weight", hidden_size) for part in ("b", "c", "x"))
    fused = [FusedTensor("conv.in_proj.weight", in_proj_parts)]
    if conv_bias:
        bias_parts = tuple((f"conv.{part}_proj.bias", hidden_size) for part in ("b", "c", "x"))
        fused.append(FusedTensor("conv.in_proj.bias", bias_parts))
    return DecoderArgs(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=hidden_size,
        intermediate_size=lfm2_intermediate_size(hf),
        num_heads=num_heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=hidden_size // num_heads,
        rms_norm_eps=float(hf.get("norm_eps", 1e-5)),
        max_position_embeddings=served_positions(hf, int(hf.get("max_position_embeddings", 128_000))),
        tie_word_embeddings=bool(tied),
        layers=layers,
        qk_norm=True,
        mlp_bias=False,
        layout=CheckpointLayout(renamed=_RENAMES, fused=tuple(fused)),
    )


@dataclass(frozen=True)
class ConvArgs:
    """The short convolutions' taps (`conv_L_cache`) and whether their projections and taps have biases."""

    kernel: int
    bias: bool

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ConvArgs:
        kernel = int(hf.get("conv_L_cache", DEFAULT_CONV_KERNEL))
        if kernel < 2:
            raise ConfigError(f"conv_L_cache is {kernel}; a short convolution needs at least 2 taps")
        return cls(kernel, bool(hf.get("conv_bias", False)))


class Lfm2ConvLayer(RecurrentLayer):
    """A pre-norm gated short convolution and a pre-norm feed-forward (SwiGLU, or LFM2-MoE's MoE block), each with a
    residual connection."""

    def __init__(self, args: DecoderArgs, kind: LayerKind, conv: ConvArgs, parallel: ParallelContext) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.conv = ShortConv(args.hidden_size, conv.kernel, conv.bias, parallel)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = feed_forward(args, kind, parallel)
        self.state_shapes = (self.conv.state_shape,)

    def forward(
        self, hidden: torch.Tensor, query_lens: Sequence[int], states: StepStates | None, state_layer: int
    ) -> torch.Tensor:
        hidden = hidden + self.conv(self.input_layernorm(hidden), query_lens, states, state_layer)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


def lfm2_layers(conv: ConvArgs) -> LayerFactory:
    """Builds a convolution layer where `layer_types` says `conv`, else a Llama-layout attention layer."""

    def layer(args: DecoderArgs, kind: LayerKind, parallel: ParallelContext) -> nn.Module:
        return Lfm2ConvLayer(args, kind, conv, parallel) if kind.recurrent else DecoderLayer(args, kind, parallel)

    return layer


class Lfm2ForCausalLM(DecoderForCausalLM):
    """LFM2's hybrid decoder (tied embeddings by default)."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        super().__init__(lfm2_args(hf_config), parallel, backend, lfm2_layers(ConvArgs.from_hf(hf_config)))
