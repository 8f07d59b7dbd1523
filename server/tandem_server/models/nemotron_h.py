"""Nemotron-H (`NemotronHForCausalLM`): a stack of single-mixer blocks, each `x + mixer(norm(x))`, the mixer chosen
per layer by `hybrid_override_pattern` (`M` Mamba-2, `*` attention, `-` MLP, `E` routed experts) or transformers 5's
`layers_block_type`.

The attention layers have no rotary embedding and no biases; the MLP blocks are ungated, `down(relu²(up(x)))`, with
biases where `mlp_bias` says; the Mamba-2 layers normalise their output over `n_groups` groups, with `use_bias` on both
projections. The expert blocks route with DeepSeek-V3's grouped sigmoid selection (`n_group`, `topk_group`,
`e_score_correction_bias`, `routed_scaling_factor`) to ungated relu² experts, optionally between latent projections
(`moe_latent_size`), and add one ungated shared expert. Every norm scales in float32 before the cast back. MLP and
expert blocks keep nothing between steps, so only the attention layers take paged caches and only the Mamba-2 layers
take state slots. Multi-token prediction layers are not served.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.attention import AttentionBackend
from tandem_server.layers.mlp import UngatedMLP
from tandem_server.layers.moe import MoeArgs, SparseMoeBlock
from tandem_server.layers.norm import RMSNorm
from tandem_server.layers.recurrent.mamba2 import Mamba2Args, Mamba2Mixer
from tandem_server.layers.recurrent.state_pool import StepStates
from tandem_server.layers.rope_config import NO_ROTATION
from tandem_server.layers.rotary import RotaryAngles
from tandem_server.models.decoder import (
    DecoderArgs,
    DecoderAttention,
    DecoderForCausalLM,
    FeedForwardLayer,
    LayerKind,
    QueryKeyValue,
    RecurrentLayer,
    StagedLayer,
    common_sizes,
)
from tandem_server.models.moe_config import grouped_moe_args
from tandem_server.weights.layout import CheckpointLayout, ExpertStack, Renamed

# `hybrid_override_pattern`'s letters and transformers 5's layer type names, per block kind.
MAMBA, ATTENTION, MLP, EXPERTS = "mamba", "attention", "mlp", "experts"
_PATTERN = {"M": MAMBA, "*": ATTENTION, "-": MLP, "E": EXPERTS}
_BLOCK_TYPES = {"linear_attention": MAMBA, "mamba": MAMBA, "full_attention": ATTENTION, "attention": ATTENTION}
_BLOCK_TYPES |= {"mlp": MLP, "moe": EXPERTS}

# The published checkpoints' `backbone.*` (transformers 5 writes `model.*`) -> Tandem's names.
_NAMES = (
    Renamed(r"^backbone\.", "model."),
    Renamed(r"^model\.embeddings\.", "model.embed_tokens."),
    Renamed(r"^model\.norm_f\.", "model.norm."),
    Renamed(r"\.mixer\.([qkvo])_proj\.", r".self_attn.\1_proj."),
)
# transformers' NemotronHConfig defaults for the expert blocks, where config.json leaves a key out.
_MOE_DEFAULTS: dict[str, Any] = {
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 7688,
    "moe_shared_expert_intermediate_size": 7688,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 1.0,
    "norm_topk_prob": True,
}


def nemotron_h_blocks(hf: dict[str, Any]) -> list[str]:
    """Each layer's block kind: `layers_block_type` where given, else `hybrid_override_pattern`'s letters."""
    listed = hf.get("layers_block_type") or hf.get("layer_types")
    if listed:
        unknown = sorted(set(listed) - set(_BLOCK_TYPES))
        kinds = [_BLOCK_TYPES.get(name, "") for name in listed]
    else:
        pattern = str(hf.get("hybrid_override_pattern") or "")
        unknown = sorted(set(pattern) - set(_PATTERN))
        kinds = [_PATTERN.get(letter, "") for letter in pattern]
    if unknown or not kinds:
        raise ConfigError(f"unsupported Nemotron-H layer types {unknown}; supported: M, E, *, - (or their names)")
    if int(hf.get("num_nextn_predict_layers") or 0) > 0:
        raise ConfigError(
            "Nemotron-H's multi-token prediction layers (num_nextn_predict_layers) are not supported; serve a "
            "checkpoint without them"
        )
    return kinds


def nemotron_h_moe_args(hf: dict[str, Any]) -> MoeArgs:
    """The expert blocks' MoE: the grouped sigmoid router over `n_routed_experts`, ungated `mlp_hidden_act` experts of
    `moe_intermediate_size` (between latent projections when `moe_latent_size` is set), and one ungated shared expert
    of `moe_shared_expert_intermediate_size`; the shared expert and the latent projections are biased per `mlp_bias`."""
    hf = {**_MOE_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}, "n_shared_experts": 0}
    return replace(
        grouped_moe_args(hf),
        shared_experts_intermediate_size=int(hf["moe_shared_expert_intermediate_size"]),
        gated_experts=False,
        mlp_bias=bool(hf.get("mlp_bias", False)),
        latent_size=int(hf.get("moe_latent_size") or 0),
    )


def _expert_stacks(num_experts: int) -> tuple[ExpertStack, ...]:
    """transformers' in-memory `mixer.experts.up_proj`/`down_proj` stacks, as a checkpoint saved from its state dict
    holds them, split into the per-expert tensors the published checkpoints name."""
    expert = "mixer.experts.{expert}."
    return (
        ExpertStack("mixer.experts.up_proj", num_experts, (expert + "up_proj.weight",)),
        ExpertStack("mixer.experts.down_proj", num_experts, (expert + "down_proj.weight",)),
    )


def nemotron_h_args(hf: dict[str, Any]) -> DecoderArgs:
    """No rotary anywhere; `mlp_hidden_act`, `layer_norm_epsilon` and `head_dim` (older configs:
    `attention_head_dim`; default 128) in place of the usual keys. The head is never
    tied to the embeddings, whatever `tie_word_embeddings` says: the reference keeps (and saves) its own."""
    blocks = nemotron_h_blocks(hf)
    layers = tuple(LayerKind(NO_ROTATION, sparse_mlp=kind == EXPERTS, recurrent=kind == MAMBA) for kind in blocks)
    head_dim = hf.get("head_dim") or hf.get("attention_head_dim") or 128
    sizes = common_sizes({**hf, "hidden_act": hf.get("mlp_hidden_act") or "relu2", "head_dim": head_dim})
    moe = nemotron_h_moe_args(hf) if EXPERTS in blocks else None
    stacks = _expert_stacks(moe.router.num_experts) if moe is not None else ()
    fused = Mamba2Args.from_nemotron_h(hf).fused_tensors("mixer")
    return DecoderArgs(
        **{**sizes, "rms_norm_eps": float(hf.get("layer_norm_epsilon", 1e-5)), "tie_word_embeddings": False},
        layers=layers,
        mlp_bias=bool(hf.get("mlp_bias", False)),
        layout=CheckpointLayout(renamed=_NAMES, fused=fused, expert_stacks=stacks),
        moe=moe,
    )


def block_norm(args: DecoderArgs) -> RMSNorm:
    """Nemotron-H's RMSNorm: the scale is applied in float32 before the cast back."""
    return RMSNorm(args.hidden_size, args.rms_norm_eps, float32_scale=True)


class NemotronMambaLayer(RecurrentLayer):
    """`x + mamba(norm(x))`."""

    def __init__(self, args: DecoderArgs, mamba: Mamba2Args, parallel: ParallelContext) -> None:
        super().__init__()
        self.norm = block_norm(args)
        self.mixer = Mamba2Mixer(mamba, parallel)
        self.state_shapes = self.mixer.state_shapes
        self.state_dtypes = self.mixer.state_dtypes

    def forward(
        self, hidden: torch.Tensor, query_lens: Sequence[int], states: StepStates | None, state_layer: int
    ) -> torch.Tensor:
        return hidden + self.mixer(self.norm(hidden), query_lens, states, state_layer)


class NemotronAttentionLayer(StagedLayer):
    """`x + attention(norm(x))`, without rotary embedding."""

    def __init__(self, args: DecoderArgs, kind: LayerKind, parallel: ParallelContext) -> None:
        super().__init__()
        self.norm = block_norm(args)
        self.self_attn = DecoderAttention(args, kind, parallel)

    def attention_inputs(self, hidden: torch.Tensor, rotation: RotaryAngles) -> QueryKeyValue:
        return self.self_attn.project(self.norm(hidden), rotation)

    def after_attention(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        return hidden + self.self_attn.output(attended)


class NemotronFeedForwardLayer(FeedForwardLayer):
    """`x + down(relu²(up(norm(x))))`, or on an expert block `x + moe(norm(x))`."""

    def __init__(self, args: DecoderArgs, kind: LayerKind, parallel: ParallelContext) -> None:
        super().__init__()
        self.norm = block_norm(args)
        self.mixer: UngatedMLP | SparseMoeBlock
        if not kind.sparse_mlp:
            self.mixer = UngatedMLP(args.hidden_size, args.intermediate_size, args.mlp_bias, args.hidden_act, parallel)
        elif args.moe is None:
            raise ValueError("invariant: Nemotron-H's expert blocks come with their MoE args")
        else:
            self.mixer = SparseMoeBlock(args.hidden_size, args.moe, args.hidden_act, parallel)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.mixer(self.norm(hidden))


class NemotronHForCausalLM(DecoderForCausalLM):
    """Nemotron-H's hybrid decoder; the blocks of `nemotron_h_blocks` in order."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        mamba = Mamba2Args.from_nemotron_h(hf_config)
        blocks = iter(nemotron_h_blocks(hf_config))

        def layer(args: DecoderArgs, kind: LayerKind, parallel: ParallelContext) -> nn.Module:
            block = next(blocks)
            if block == MAMBA:
                return NemotronMambaLayer(args, mamba, parallel)
            if block == ATTENTION:
                return NemotronAttentionLayer(args, kind, parallel)
            return NemotronFeedForwardLayer(args, kind, parallel)

        args = nemotron_h_args(hf_config)
        super().__init__(args, parallel, backend, layer)
        self.model.norm = block_norm(args)
