"""Granite (3.x dense): the Llama layout with multipliers on the embeddings, the block outputs, the query scale and
the logits."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from tandem_server.distributed import ParallelContext
from tandem_server.layers.attention import AttentionBackend
from tandem_server.models.decoder import (
    DecoderArgs,
    DecoderForCausalLM,
    DecoderLayer,
    LayerKind,
    common_sizes,
    uniform_layers,
)


def granite_args(hf: dict[str, Any]) -> DecoderArgs:
    """Granite's options: `attention_multiplier` is the query scale, `embedding_multiplier` scales the embeddings."""
    attention_bias = bool(hf.get("attention_bias", False))
    return DecoderArgs(
        **common_sizes(hf),
        layers=uniform_layers(hf, None),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=bool(hf.get("mlp_bias", False)),
        embedding_scale=float(hf.get("embedding_multiplier", 1.0)),
        query_scale=float(hf.get("attention_multiplier", 1.0)),
    )


class GraniteDecoderLayer(DecoderLayer):
    """Llama's layer whose attention and MLP outputs are multiplied by `residual_multiplier` before their residual
    adds."""

    def __init__(
        self, args: DecoderArgs, kind: LayerKind, parallel: ParallelContext, residual_multiplier: float = 1.0
    ) -> None:
        super().__init__(args, kind, parallel)
        self.residual_multiplier = residual_multiplier

    def after_attention(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.self_attn.output(attended) * self.residual_multiplier
        return hidden + self.mlp(self.post_attention_layernorm(hidden)) * self.residual_multiplier


class GraniteForCausalLM(DecoderForCausalLM):
    """Pre-norm SwiGLU decoder with scaled residual branches; logits are divided by `logits_scaling`."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        multiplier = float(hf_config.get("residual_multiplier", 1.0))
        layer_factory = partial(GraniteDecoderLayer, residual_multiplier=multiplier)
        super().__init__(granite_args(hf_config), parallel, backend, layer_factory)
        self.logits_scaling = float(hf_config.get("logits_scaling", 1.0))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return super().compute_logits(hidden) / self.logits_scaling
