"""Granite 4.0-H (`GraniteMoeHybridForCausalLM`): a hybrid of Mamba-2 layers and grouped-query attention layers (per
`layer_types`), each followed by a shared SwiGLU and, where `num_local_experts` > 0, routed experts beside it.

Granite's multipliers: `embedding_multiplier` scales the embeddings, `residual_multiplier` each block's output before
its residual add, `attention_multiplier` is the query scale, and the logits are divided by `logits_scaling`. The
attention layers rotate queries and keys only when `position_embedding_type` is `rope` (the published hybrids use
none). The checkpoint stacks the shared MLP's gate and up rows in `shared_mlp.input_linear` and each expert's in
`block_sparse_moe.input_linear`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.attention import AttentionBackend
from tandem_server.layers.moe import MoeArgs
from tandem_server.layers.norm import RMSNorm
from tandem_server.layers.recurrent.mamba2 import Mamba2Args, Mamba2Mixer
from tandem_server.layers.recurrent.state_pool import StepStates
from tandem_server.layers.rope_config import NO_ROTATION, RopeConfig
from tandem_server.models.config import num_experts
from tandem_server.models.decoder import (
    DecoderArgs,
    DecoderForCausalLM,
    LayerFactory,
    LayerKind,
    RecurrentLayer,
    common_sizes,
    feed_forward,
)
from tandem_server.models.granite import GraniteDecoderLayer
from tandem_server.models.moe_config import router_config, stacked_experts
from tandem_server.weights.layout import CheckpointLayout, FusedTensor, Renamed

# transformers 5 spells the published `mamba` and `attention` as `linear_attention` and `full_attention`.
MAMBA_LAYER_TYPES = ("mamba", "linear_attention")
ATTENTION_LAYER_TYPES = ("attention", "full_attention")

# Checkpoint names of the routed experts (published, or as transformers 5 holds them) -> the MoE block's.
_EXPERT_NAMES = (
    Renamed(r"\.block_sparse_moe\.(router\.layer|router)\.weight$", ".mlp.gate.weight"),
    Renamed(r"\.block_sparse_moe\.(input_linear\.weight|experts\.gate_up_proj)$", ".mlp.experts.gate_up_proj"),
    Renamed(r"\.block_sparse_moe\.(output_linear\.weight|experts\.down_proj)$", ".mlp.experts.down_proj"),
)


def granite_hybrid_layer_types(hf: dict[str, Any]) -> list[bool]:
    """Whether each layer is a Mamba-2 layer: `layer_types` (or `layers_block_type`), every layer without either."""
    num_layers = int(hf["num_hidden_layers"])
    layer_types = hf.get("layer_types") or hf.get("layers_block_type") or ["mamba"] * num_layers
    if len(layer_types) != num_layers:
        raise ConfigError(f"layer_types lists {len(layer_types)} layers, num_hidden_layers is {num_layers}")
    unknown = sorted(set(layer_types) - {*MAMBA_LAYER_TYPES, *ATTENTION_LAYER_TYPES})
    if unknown:
        supported = ", ".join((*MAMBA_LAYER_TYPES, *ATTENTION_LAYER_TYPES))
        raise ConfigError(f"unsupported Granite hybrid layer types {unknown}; supported: {supported}")
    return [kind in MAMBA_LAYER_TYPES for kind in layer_types]


def granite_hybrid_rope(hf: dict[str, Any]) -> RopeConfig:
    """Rotary settings when `position_embedding_type` is `rope`, else none (NoPE)."""
    kind = hf.get("position_embedding_type")
    if kind in (None, "nope"):
        return NO_ROTATION
    if kind != "rope":
        raise ConfigError(f"position_embedding_type {kind!r} is not supported; supported: rope, or none")
    return RopeConfig.from_hf(hf)


def granite_hybrid_layout(hf: dict[str, Any], shared_size: int, sparse: bool) -> CheckpointLayout:
    """The shared MLP's stacked rows split into the dense MLP (or, beside experts, the MoE block's shared experts);
    the experts' stacks; the Mamba-2 layers' stacked `in_proj` and `conv1d`."""
    mlp = "mlp.shared_experts" if sparse else "mlp"
    renamed = [Renamed(r"\.shared_mlp\.output_linear\.", f".{mlp}.down_proj.")]
    parts = ((f"{mlp}.gate_proj.weight", shared_size), (f"{mlp}.up_proj.weight", shared_size))
    fused = (FusedTensor("shared_mlp.input_linear.weight", parts), *Mamba2Args.from_hf(hf).fused_tensors("mamba"))
    if not sparse:
        return CheckpointLayout(renamed=tuple(renamed), fused=fused)
    return CheckpointLayout(renamed=(*renamed, *_EXPERT_NAMES), fused=fused, expert_stacks=stacked_experts(hf))


def granite_hybrid_args(hf: dict[str, Any]) -> DecoderArgs:
    """Granite's multipliers on the Llama layout; the dense feed-forward is the shared MLP
    (`shared_intermediate_size`), `intermediate_size` each routed expert's width."""
    shared_size = int(hf.get("shared_intermediate_size", 1024))
    sparse = num_experts(hf) > 0
    rope = granite_hybrid_rope(hf)
    layers = tuple(LayerKind(rope, sparse_mlp=sparse, recurrent=mamba) for mamba in granite_hybrid_layer_types(hf))
    moe = None
    if sparse:
        router = router_config(hf, normalize_top_k=True)
        moe = MoeArgs(router, int(hf["intermediate_size"]), shared_experts_intermediate_size=shared_size)
    attention_bias = bool(hf.get("attention_bias", False))
    return DecoderArgs(
        **{**common_sizes(hf), "intermediate_size": shared_size},
        layers=layers,
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        embedding_scale=float(hf.get("embedding_multiplier", 1.0)),
        query_scale=float(hf.get("attention_multiplier", 1.0)),
        layout=granite_hybrid_layout(hf, shared_size, sparse),
        moe=moe,
    )


class GraniteMambaLayer(RecurrentLayer):
    """Pre-norm Mamba-2 and a pre-norm feed-forward, each output times `residual_multiplier` before its residual
    add."""

    def __init__(
        self, args: DecoderArgs, kind: LayerKind, mamba: Mamba2Args, parallel: ParallelContext, residual: float
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mamba = Mamba2Mixer(mamba, parallel)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = feed_forward(args, kind, parallel)
        self.residual_multiplier = residual
        self.state_shapes = self.mamba.state_shapes
        self.state_dtypes = self.mamba.state_dtypes

    def forward(
        self, hidden: torch.Tensor, query_lens: Sequence[int], states: StepStates | None, state_layer: int
    ) -> torch.Tensor:
        mixed = self.mamba(self.input_layernorm(hidden), query_lens, states, state_layer)
        hidden = hidden + mixed * self.residual_multiplier
        return hidden + self.mlp(self.post_attention_layernorm(hidden)) * self.residual_multiplier


def granite_hybrid_layers(mamba: Mamba2Args, residual: float) -> LayerFactory:
    """A Mamba-2 layer where `layer_types` says so, else Granite's attention layer."""

    def layer(args: DecoderArgs, kind: LayerKind, parallel: ParallelContext) -> nn.Module:
        if kind.recurrent:
            return GraniteMambaLayer(args, kind, mamba, parallel, residual)
        return GraniteDecoderLayer(args, kind, parallel, residual_multiplier=residual)

    return layer


class GraniteMoeHybridForCausalLM(DecoderForCausalLM):
    """Granite 4.0-H's hybrid decoder; logits are divided by `logits_scaling`."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        residual = float(hf_config.get("residual_multiplier", 1.0))
        layers = granite_hybrid_layers(Mamba2Args.from_hf(hf_config), residual)
        super().__init__(granite_hybrid_args(hf_config), parallel, backend, layers)
        self.logits_scaling = float(hf_config.get("logits_scaling", 1.0))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return super().compute_logits(hidden) / self.logits_scaling
