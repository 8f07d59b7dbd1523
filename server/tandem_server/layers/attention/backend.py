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
    # The decode mirror (`torch` backend): decoding requests' keys and values, one row per request,
    # `[rows, capacity, kv_heads, head_dim]`; None when the step gathers from the blocks instead.
    mirror_key: torch.Tensor | None = None
    mirror_value: torch.Tensor | None = None


class AttentionBackend(Protocol):
    """Computes attention for a mixed step of prompt chunks and decode tokens."""

    name: str
    # True when the backend reads AttentionMetadata.prefills/decode rather than only the paged layout.
    uses_slot_lists: bool
    # True when a decode-only step runs with fixed shapes and no host sync, so it can be captured in a CUDA graph.
    supports_cuda_graphs: bool

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


def write_step_kv(cache: LayerCache, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Stores the step's keys and values at their flat cache slots (block_id * block_size + offset)."""
    num_kv_heads, head_dim = cache.key.shape[-2:]
    cache.key.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key.to(cache.key.dtype))
    cache.value.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value.to(cache.value.dtype))
