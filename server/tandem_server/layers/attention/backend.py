"""The attention backend interface: build the step's own metadata once, write K/V into the paged cache, attend."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from tandem_server.layers.attention.metadata import AttentionMetadata


@dataclass(frozen=True)
class AttentionParams:
    """One layer's attention settings: score scale, sliding window, score soft-capping and attention sinks."""

    scale: float
    # A query at position p sees keys at positions (p - sliding_window, p]; None means every earlier position.
    sliding_window: int | None = None
    # Scores become tanh(score / cap) * cap before the softmax when set.
    logit_softcap: float | None = None
    # `[heads]` of this rank, when set: one learned logit per query head that joins every softmax's denominator as a
    # key whose value is zero (gpt-oss), so a row's weights sum to less than one.
    sinks: torch.Tensor | None = None


@dataclass(frozen=True)
class LayerCache:
    """One layer's paged cache: key and value tensors `[blocks, block_size, kv_heads, head_dim]`."""

    key: torch.Tensor
    value: torch.Tensor


@dataclass(frozen=True)
class PreparedStep:
    """What every layer of one step reads: the backend's metadata and the per-layer caches it attends through."""

    metadata: AttentionMetadata
    layers: Sequence[LayerCache]


class AttentionBackend(Protocol):
    """Computes attention for a mixed step of prompt chunks and decode tokens.

    A backend builds whatever it reads beyond the common metadata in `prepare`, once per step. One that keeps state
    between steps implements `KeepsStepState` too.
    """

    name: str
    # True when a decode-only step runs with fixed shapes and no host sync, so it can be captured in a CUDA graph.
    supports_cuda_graphs: bool

    def prepare(self, metadata: AttentionMetadata, layers: Sequence[LayerCache]) -> PreparedStep:
        """This backend's metadata and layer caches for one step, built from the common metadata."""
        ...

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


@runtime_checkable
class KeepsStepState(Protocol):
    """A backend that keeps state between steps (the torch backend's decode mirror); the execution layer tells it
    when the cache is replaced and when requests end."""

    def bind_cache(self, layers: Sequence[LayerCache]) -> None:
        """Called once the KV cache is allocated, before any step runs on it."""
        ...

    def forget(self, request_ids: Iterable[int]) -> None:
        """Drops what is kept for requests that finished, were preempted, or arrive anew under a known id."""
        ...

    def clear(self) -> None:
        """Drops everything kept for any request (after a reset or a failed step)."""
        ...


class CommonMetadataOnly:
    """A backend that reads only the common metadata."""

    def prepare(self, metadata: AttentionMetadata, layers: Sequence[LayerCache]) -> PreparedStep:
        """The common metadata and the paged layers as they are."""
        return PreparedStep(metadata, layers)


def write_step_kv(cache: LayerCache, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Stores the step's keys and values at their flat cache slots (block_id * block_size + offset)."""
    num_kv_heads, head_dim = cache.key.shape[-2:]
    cache.key.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key.to(cache.key.dtype))
    cache.value.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value.to(cache.value.dtype))
