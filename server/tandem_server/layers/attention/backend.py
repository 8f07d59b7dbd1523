"""The attention backend interface: write the step's K/V into the paged cache, attend through it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from tandem_server.layers.attention.metadata import AttentionMetadata


@dataclass(frozen=True)
class AttentionParams:
    """One layer's attention settings: score scale, sliding window and score soft-capping."""

    scale: float
    # A query at position p sees keys at positions (p - sliding_window, p]; None means every earlier position.
    sliding_window: int | None = None
    # Scores become tanh(score / cap) * cap before the softmax when set.
    logit_softcap: float | None = None


@dataclass(frozen=True)
class LayerCache:
    """One layer's paged cache: key and value tensors `[blocks, block_size, kv_heads, head_dim]`."""

    key: torch.Tensor
    value: torch.Tensor


class AttentionBackend(Protocol):
    """Computes attention for a mixed step of prompt chunks and decode tokens."""

    name: str

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        cache: LayerCache,
        metadata: AttentionMetadata,
        params: AttentionParams,
    ) -> torch.Tensor:
        """`query` [tokens, heads, dim], `key`/`value` [tokens, kv_heads, dim] -> [tokens, heads, dim]."""
        ...
