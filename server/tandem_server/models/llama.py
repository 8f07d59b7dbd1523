"""Llama family: Llama 2/3, SmolLM and Mistral (whose `sliding_window` applies to every layer)."""

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


def llama_args(hf: dict[str, Any]) -> DecoderArgs:
    """Llama's options: one bias flag for all attention projections, one for the MLP."""
    windows = windows_from_layer_types(hf)
    if windows is None and hf.get("sliding_window"):
        windows = (int(hf["sliding_window"]),) * int(hf["num_hidden_layers"])
    attention_bias = bool(hf.get("attention_bias", False))
    return DecoderArgs(
        **common_sizes(hf),
        layers=uniform_layers(hf, windows),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=bool(hf.get("mlp_bias", False)),
    )


class LlamaForCausalLM(DecoderForCausalLM):
    """Pre-norm SwiGLU decoder with grouped-query attention."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        super().__init__(llama_args(hf_config), parallel, backend)
