"""Qwen2 / Qwen2.5: the Llama layout with biases on the q/k/v projections (not on o_proj)."""

from __future__ import annotations

from typing import Any

from tandem_server.distributed import ParallelContext
from tandem_server.layers.attention import AttentionBackend
from tandem_server.models.decoder import (
    DecoderArgs,
    DecoderForCausalLM,
    common_sizes,
    uniform_layers,
    windows_from_layer_types,
)


def qwen_windows(hf: dict[str, Any]) -> tuple[int | None, ...] | None:
    """`layer_types` when present; else, with `use_sliding_window`, layers from `max_window_layers` on slide."""
    windows = windows_from_layer_types(hf)
    if windows is not None or not hf.get("use_sliding_window") or not hf.get("sliding_window"):
        return windows
    num_layers = int(hf["num_hidden_layers"])
    first_sliding = int(hf.get("max_window_layers", num_layers))
    return tuple(int(hf["sliding_window"]) if i >= first_sliding else None for i in range(num_layers))


def qwen2_args(hf: dict[str, Any]) -> DecoderArgs:
    """Qwen2's q/k/v always carry a bias; o_proj and the MLP never do."""
    return DecoderArgs(**common_sizes(hf), layers=uniform_layers(hf, qwen_windows(hf)), qkv_bias=True)


class Qwen2ForCausalLM(DecoderForCausalLM):
    """Pre-norm SwiGLU decoder with q/k/v biases."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        super().__init__(qwen2_args(hf_config), parallel, backend)
