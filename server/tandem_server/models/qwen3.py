"""Qwen3: the Llama layout with a per-head RMSNorm on queries and keys before the rotation."""

from __future__ import annotations

from typing import Any

from tandem_server.distributed import ParallelContext
from tandem_server.layers.attention import AttentionBackend
from tandem_server.models.decoder import DecoderArgs, DecoderForCausalLM, common_sizes, uniform_layers
from tandem_server.models.qwen2 import qwen_windows


def qwen3_args(hf: dict[str, Any]) -> DecoderArgs:
    """Qwen3's q/k norms; `attention_bias` (normally off) covers all four attention projections."""
    attention_bias = bool(hf.get("attention_bias", False))
    return DecoderArgs(
        **common_sizes(hf),
        layers=uniform_layers(hf, qwen_windows(hf)),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        qk_norm=True,
    )


class Qwen3ForCausalLM(DecoderForCausalLM):
    """Pre-norm SwiGLU decoder with q/k RMSNorm."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        super().__init__(qwen3_args(hf_config), parallel, backend)
