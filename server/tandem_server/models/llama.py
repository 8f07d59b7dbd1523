"""Llama family (Llama 2/3, SmolLM, Mistral without a binding sliding window), with tensor-parallel linears."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.activation import silu_and_mul
from tandem_server.layers.attention import AttentionBackend, AttentionMetadata, LayerCache
from tandem_server.layers.embedding import Embedding, LMHead
from tandem_server.layers.linear import ColumnParallelLinear, RowParallelLinear
from tandem_server.layers.norm import RMSNorm
from tandem_server.layers.rotary import RopeConfig, RotaryEmbedding
from tandem_server.models.config import ModelSpec


@dataclass(frozen=True)
class LlamaArgs:
    """Every size the Llama family reads from config.json."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> LlamaArgs:
        """Validates what the implementation supports and fills the family's defaults."""
        if hf.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"hidden_act {hf['hidden_act']!r} is not supported by the Llama family (only silu)")
        num_heads = int(hf["num_attention_heads"])
        max_positions = int(hf.get("max_position_embeddings", 2048))
        # A sliding window no shorter than the sequence is full attention, so capping positions keeps it exact.
        window = hf.get("sliding_window")
        if window is not None and hf.get("use_sliding_window", True):
            max_positions = min(max_positions, int(window))
        return cls(
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
            head_dim=int(hf.get("head_dim") or int(hf["hidden_size"]) // num_heads),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=max_positions,
            rope=RopeConfig.from_hf(hf),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=bool(hf.get("attention_bias", False)),
            mlp_bias=bool(hf.get("mlp_bias", False)),
        )


class LlamaAttention(nn.Module):
    """Grouped-query self-attention; this rank holds `num_heads / world_size` query heads."""

    def __init__(
        self, args: LlamaArgs, parallel: ParallelContext, backend: AttentionBackend, rotary: RotaryEmbedding
    ) -> None:
        super().__init__()
        self.num_heads = parallel.shard_size(args.num_heads, "attention heads")
        self.num_kv_heads = parallel.shard_size(args.num_kv_heads, "key/value heads")
        self.head_dim = args.head_dim
        q_size, kv_size = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
        self.q_proj = ColumnParallelLinear(args.hidden_size, q_size, args.attention_bias, parallel)
        self.k_proj = ColumnParallelLinear(args.hidden_size, kv_size, args.attention_bias, parallel)
        self.v_proj = ColumnParallelLinear(args.hidden_size, kv_size, args.attention_bias, parallel)
        self.o_proj = RowParallelLinear(q_size, args.hidden_size, args.attention_bias, parallel)
        self.rotary = rotary
        self.backend = backend

    def forward(
        self, hidden: torch.Tensor, positions: torch.Tensor, cache: LayerCache, metadata: AttentionMetadata
    ) -> torch.Tensor:
        tokens = hidden.shape[0]
        query = self.q_proj(hidden).view(tokens, self.num_heads, self.head_dim)
        key = self.k_proj(hidden).view(tokens, self.num_kv_heads, self.head_dim)
        value = self.v_proj(hidden).view(tokens, self.num_kv_heads, self.head_dim)
        query, key = self.rotary(positions, query, key)
        attended = self.backend.forward(query, key, value, cache, metadata)
        return self.o_proj(attended.reshape(tokens, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, args: LlamaArgs, parallel: ParallelContext) -> None:
        super().__init__()
        self.gate_proj = ColumnParallelLinear(args.hidden_size, args.intermediate_size, args.mlp_bias, parallel)
        self.up_proj = ColumnParallelLinear(args.hidden_size, args.intermediate_size, args.mlp_bias, parallel)
        self.down_proj = RowParallelLinear(args.intermediate_size, args.hidden_size, args.mlp_bias, parallel)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_proj(hidden), self.up_proj(hidden)))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks, each with a residual connection."""

    def __init__(
        self, args: LlamaArgs, parallel: ParallelContext, backend: AttentionBackend, rotary: RotaryEmbedding
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = LlamaAttention(args, parallel, backend, rotary)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = LlamaMLP(args, parallel)

    def forward(
        self, hidden: torch.Tensor, positions: torch.Tensor, cache: LayerCache, metadata: AttentionMetadata
    ) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), positions, cache, metadata)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LlamaModel(nn.Module):
    """Embedding, decoder stack and final norm; parameter names mirror the checkpoint's `model.*`."""

    def __init__(self, args: LlamaArgs, parallel: ParallelContext, backend: AttentionBackend) -> None:
        super().__init__()
        self.embed_tokens = Embedding(args.vocab_size, args.hidden_size)
        # One cos/sin table shared by every layer.
        rotary = RotaryEmbedding(args.head_dim, args.max_position_embeddings, args.rope)
        self.layers = nn.ModuleList(LlamaDecoderLayer(args, parallel, backend, rotary) for _ in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: Sequence[LayerCache],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        for layer, cache in zip(self.layers, kv_cache, strict=True):
            hidden = layer(hidden, positions, cache, metadata)
        return self.norm(hidden)


class LlamaForCausalLM(nn.Module):
    """Causal LM over a flat batch of tokens from many requests; logits only for the rows asked."""

    def __init__(self, hf_config: dict[str, Any], parallel: ParallelContext, backend: AttentionBackend) -> None:
        super().__init__()
        args = LlamaArgs.from_hf(hf_config)
        self.args = args
        self.model = LlamaModel(args, parallel, backend)
        tied = self.model.embed_tokens if args.tie_word_embeddings else None
        self.lm_head = LMHead(args.vocab_size, args.hidden_size, tied)
        self.spec = ModelSpec(
            vocab_size=args.vocab_size,
            num_layers=args.num_layers,
            num_kv_heads=parallel.shard_size(args.num_kv_heads, "key/value heads"),
            head_dim=args.head_dim,
            max_position_embeddings=args.max_position_embeddings,
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: Sequence[LayerCache],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Final hidden states `[tokens, hidden]`; K/V of every token are written into `kv_cache`."""
        return self.model(input_ids, positions, kv_cache, metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits `[rows, vocab]` for the selected hidden rows."""
        return self.lm_head(hidden)

    def skipped_checkpoint_tensors(self) -> frozenset[str]:
        """Checkpoint tensors that have no parameter of their own (a tied head's duplicate)."""
        return frozenset({"lm_head.weight"}) if self.args.tie_word_embeddings else frozenset()
