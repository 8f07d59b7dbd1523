"""SmolLM3: the Llama layout with some layers left without rotary position embedding (NoPE)."""

from __future__ import annotations

from typing import Any

from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.attention import AttentionBackend
from tandem_server.layers.rope_config import NO_ROTATION, RopeConfig
from tandem_server.models.decoder import (
    DecoderArgs,
    DecoderForCausalLM,
    LayerKind,
    common_sizes,
    windows_from_layer_types,
)

DEFAULT_ROPE_THETA = 2_000_000.0
DEFAULT_NO_ROPE_LAYER_INTERVAL = 4


def smollm3_args(hf: dict[str, Any]) -> DecoderArgs:
    """SmolLM3's options: Llama's bias flags, tied embeddings unless told otherwise, NoPE layers."""
    attention_bias = bool(hf.get("attention_bias", False))
    return DecoderArgs(
        **{**common_sizes(hf), "tie_word_embeddings": bool(hf.get("tie_word_embeddings", True))},
        layers=_layers(hf),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=bool(hf.get("mlp_bias", False)),
    )


def _layers(hf: dict[str, Any]) -> tuple[LayerKind, ...]:
    rotates = _rotating_layers(hf)
    windows = windows_from_layer_types(hf)
    if windows is None:
        # Without `layer_types`, the NoPE layers slide when sliding windows are on.
        window = int(hf["sliding_window"]) if hf.get("use_sliding_window") and hf.get("sliding_window") else None
        windows = tuple(None if rotating else window for rotating in rotates)
    rope = RopeConfig.from_hf({"rope_theta": DEFAULT_ROPE_THETA, **hf})
    return tuple(
        LayerKind(rope if rotating else NO_ROTATION, window) for rotating, window in zip(rotates, windows, strict=True)
    )


def _rotating_layers(hf: dict[str, Any]) -> tuple[bool, ...]:
    """Per layer, whether it rotates: `no_rope_layers` (1 rotates, 0 is NoPE), else every
    `no_rope_layer_interval`-th layer is NoPE."""
    num_layers = int(hf["num_hidden_layers"])
    flags = hf.get("no_rope_layers")
    if flags is None:
        interval = int(hf.get("no_rope_layer_interval") or DEFAULT_NO_ROPE_LAYER_INTERVAL)
        return tuple((i + 1) % interval != 0 for i in range(num_layers))
    if len(flags) < num_layers:
        raise ConfigError(f"no_rope_layers lists {len(flags)} layers, num_hidden_layers is {num_layers}")
    return tuple(bool(flag) for flag in flags[:num_layers])


class SmolLM3ForCausalLM(DecoderForCausalLM):
    """Pre-norm SwiGLU decoder whose NoPE layers attend without rotating queries and keys."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        super().__init__(smollm3_args(hf_config), parallel, backend)
