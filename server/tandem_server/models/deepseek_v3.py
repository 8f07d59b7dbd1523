"""DeepSeek-V3 (`DeepseekV3ForCausalLM`, also Kimi K2's and DeepSeek-V3.x's layout): multi-head latent attention
whose cache keeps a compressed latent and a rotary key per token, and after the first `first_k_dense_replace` dense
layers, MoE blocks with grouped sigmoid routing and shared experts."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.attention import AttentionBackend, AttentionMetadata, LayerCache
from tandem_server.layers.attention.latent_cache import LatentLayerCache
from tandem_server.layers.attention.latent_step import AbsorbedDecoding
from tandem_server.layers.latent_attention import LatentAttention, LatentAttentionArgs
from tandem_server.layers.norm import RMSNorm
from tandem_server.layers.rope_config import RopeConfig
from tandem_server.layers.rotary import RotaryAngles
from tandem_server.models.decoder import DecoderArgs, DecoderForCausalLM, LayerKind, common_sizes, feed_forward
from tandem_server.models.moe_config import (
    after_first_dense,
    grouped_moe_args,
    prediction_layer_prefixes,
    stacked_experts,
    with_sparse_layers,
)
from tandem_server.weights.layout import CheckpointLayout

# transformers' defaults for the options config.json may leave out.
CONFIG_DEFAULTS: dict[str, Any] = {
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "rope_interleave": True,
    "n_group": 8,
    "topk_group": 4,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "n_shared_experts": 1,
    "first_k_dense_replace": 3,
    "num_nextn_predict_layers": 1,
}


def latent_attention_args(hf: dict[str, Any], rope: RopeConfig) -> LatentAttentionArgs:
    """The MLA sizes (`hf` with CONFIG_DEFAULTS filled in); the softmax scale is `qk_head_dim ** -0.5`, times
    YaRN's `mscale(factor, mscale_all_dim)` squared when the rope scaling names `mscale_all_dim` (transformers'
    rule)."""
    q_lora_rank = hf["q_lora_rank"]
    nope, rope_dim = int(hf["qk_nope_head_dim"]), int(hf["qk_rope_head_dim"])
    scale = (nope + rope_dim) ** -0.5
    mscale_all_dim = _rope_parameters(hf).get("mscale_all_dim")
    if rope.rope_type != "default" and mscale_all_dim and rope.factor > 1:
        scale *= (0.1 * float(mscale_all_dim) * math.log(rope.factor) + 1.0) ** 2
    return LatentAttentionArgs(
        hidden_size=int(hf["hidden_size"]),
        num_heads=int(hf["num_attention_heads"]),
        q_lora_rank=None if q_lora_rank is None else int(q_lora_rank),
        kv_lora_rank=int(hf["kv_lora_rank"]),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope_dim,
        v_head_dim=int(hf["v_head_dim"]),
        bias=bool(hf.get("attention_bias", False)),
        scale=scale,
    )


def _rope_parameters(hf: dict[str, Any]) -> dict[str, Any]:
    return {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}


def deepseek_v3_args(hf: dict[str, Any]) -> DecoderArgs:
    """The decoder's sizes (`hf` with CONFIG_DEFAULTS filled in): its rotary table covers `qk_rope_head_dim`
    (interleaved pairs unless `rope_interleave` is off), and the per-head sizes of the cache are MLA's own
    (`LatentAttentionArgs`)."""
    rope = replace(RopeConfig.from_hf(hf), interleaved=bool(hf["rope_interleave"]))
    layers = (LayerKind(rope),) * int(hf["num_hidden_layers"])
    return DecoderArgs(
        **{**common_sizes(hf), "head_dim": int(hf["qk_rope_head_dim"])},
        layers=with_sparse_layers(layers, after_first_dense(hf)),
        moe=grouped_moe_args(hf),
        layout=CheckpointLayout(skipped_prefixes=prediction_layer_prefixes(hf), expert_stacks=stacked_experts(hf)),
    )


class LatentDecoderLayer(nn.Module):
    """Pre-norm latent attention and feed-forward blocks with residuals. Its attention reads the latent cache
    itself, around the backend, so it has no stages for per-layer compilation."""

    def __init__(
        self, args: DecoderArgs, kind: LayerKind, parallel: ParallelContext, attention: LatentAttentionArgs
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = LatentAttention(attention, parallel)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = feed_forward(args, kind, parallel)

    def forward(
        self,
        hidden: torch.Tensor,
        rotation: RotaryAngles,
        cache: LayerCache,
        metadata: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        if not isinstance(cache, LatentLayerCache):
            raise TypeError("invariant: a latent attention layer runs on a latent cache (ModelSpec.latent_dim)")
        if not isinstance(backend, AbsorbedDecoding):
            raise TypeError("invariant: the model was built on a backend that serves latent attention")
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), rotation, cache, metadata, backend)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DeepseekV3ForCausalLM(DecoderForCausalLM):
    """DeepSeek-V3's decoder, on a backend that reads latent caches (the torch and Triton backends)."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        if not isinstance(backend, AbsorbedDecoding):
            raise ConfigError(
                "multi-head latent attention (MLA) runs on the torch or triton attention backend; the "
                f"{backend.name} backend has no MLA kernel (--attention-backend triton on CUDA, torch anywhere)"
            )
        hf = {**CONFIG_DEFAULTS, **hf_config}
        args = deepseek_v3_args(hf)
        attention = latent_attention_args(hf, args.layers[0].rope)

        def layer(args: DecoderArgs, kind: LayerKind, parallel: ParallelContext) -> LatentDecoderLayer:
            return LatentDecoderLayer(args, kind, parallel, attention)

        super().__init__(args, parallel, backend, layer)
        # One row per token and layer: the latent, then the rotary key.
        self.spec = replace(self.spec, num_kv_heads=1, head_dim=attention.cache_dim, latent_dim=attention.kv_lora_rank)
