"""Gemma 3 text: (1 + weight) RMSNorms around both blocks, scaled embeddings, gelu-tanh MLP, q/k norms,
alternating sliding-window (local rotary base) and global layers, optional logit soft-capping."""

from __future__ import annotations

from typing import Any

import torch

from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
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

GLOBAL_ROPE_THETA = 1_000_000.0
LOCAL_ROPE_THETA = 10_000.0
DEFAULT_SLIDING_WINDOW_PATTERN = 6


def gemma3_args(hf: dict[str, Any]) -> DecoderArgs:
    """Gemma 3's options; both the saved (`rope_parameters` per layer type) and Hub config spellings are read."""
    if hf.get("use_bidirectional_attention"):
        raise ConfigError("use_bidirectional_attention is not supported; only causal Gemma 3 models are")
    sizes = common_sizes(hf)
    attention_bias = bool(hf.get("attention_bias", False))
    return DecoderArgs(
        **{**sizes, "tie_word_embeddings": bool(hf.get("tie_word_embeddings", True))},
        layers=_layers(hf),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        qk_norm=True,
        norm_unit_offset=True,
        embedding_scale=sizes["hidden_size"] ** 0.5,
        query_scale=float(hf.get("query_pre_attn_scalar", 256)) ** -0.5,
        attn_logit_softcap=_optional_float(hf.get("attn_logit_softcapping")),
        final_logit_softcap=_optional_float(hf.get("final_logit_softcapping")),
    )


def _layers(hf: dict[str, Any]) -> tuple[LayerKind, ...]:
    windows = windows_from_layer_types(hf)
    if windows is None:
        pattern = int(
            hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or DEFAULT_SLIDING_WINDOW_PATTERN
        )
        window = int(hf.get("sliding_window", 4096))
        num_layers = int(hf["num_hidden_layers"])
        # Every `pattern`-th layer is global; the others slide.
        windows = tuple(None if (i + 1) % pattern == 0 else window for i in range(num_layers))
    global_rope, local_rope = _ropes(hf)
    return tuple(LayerKind(local_rope if w is not None else global_rope, w) for w in windows)


def _ropes(hf: dict[str, Any]) -> tuple[RopeConfig, RopeConfig]:
    # Saved configs nest rotary parameters by layer type; Hub configs give rope_theta/rope_scaling for global
    # layers and rope_local_base_freq (unscaled) for local ones.
    nested = hf.get("rope_parameters") or {}
    if isinstance(nested.get("full_attention"), dict) or isinstance(nested.get("sliding_attention"), dict):
        context = {"max_position_embeddings": hf.get("max_position_embeddings")}
        global_params = {"rope_theta": GLOBAL_ROPE_THETA, **nested.get("full_attention", {})}
        local_params = {"rope_theta": LOCAL_ROPE_THETA, **nested.get("sliding_attention", {})}
        return (
            RopeConfig.from_hf({**context, "rope_parameters": global_params}),
            RopeConfig.from_hf({**context, "rope_parameters": local_params}),
        )
    global_rope = RopeConfig.from_hf({"rope_theta": GLOBAL_ROPE_THETA, **hf})
    return global_rope, RopeConfig(theta=float(hf.get("rope_local_base_freq", LOCAL_ROPE_THETA)))


def _optional_float(value: float | None) -> float | None:
    return None if value is None else float(value)


class Gemma3DecoderLayer(StagedLayer):
    """Attention and MLP blocks, each normalised on the way in and on the way out, with residuals."""

    def __init__(self, args: DecoderArgs, kind: LayerKind, parallel: ParallelContext) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, unit_offset=True)
        self.self_attn = DecoderAttention(args, kind, parallel)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, unit_offset=True)
        self.pre_feedforward_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, unit_offset=True)
        self.mlp = dense_mlp(args, parallel)
        self.post_feedforward_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, unit_offset=True)

    def attention_inputs(self, hidden: torch.Tensor, rotation: RotaryAngles) -> QueryKeyValue:
        return self.self_attn.project(self.input_layernorm(hidden), rotation)

    def after_attention(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.post_attention_layernorm(self.self_attn.output(attended))
        return hidden + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(hidden)))


class Gemma3ForCausalLM(DecoderForCausalLM):
    """Gemma 3's text decoder (tied embeddings by default)."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        super().__init__(gemma3_args(hf_config), parallel, backend, Gemma3DecoderLayer)
