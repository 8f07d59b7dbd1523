"""Attention through Tandem's own Triton paged-attention kernel (CUDA; Triton ships with torch's CUDA wheels)."""

from __future__ import annotations

import torch

from tandem_server.layers.attention.backend import AttentionParams, LayerCache, write_step_kv
from tandem_server.layers.attention.metadata import AttentionMetadata


class TritonAttentionBackend:
    """Mixed prefill/decode steps, cached prefixes, GQA, sliding windows and softcap in one kernel launch."""

    name = "triton"
    uses_slot_lists = False
    supports_cuda_graphs = True

    def __init__(self) -> None:
        # Imported here so a machine without Triton can still import (and select among) the other backends.
        from tandem_server.layers.attention.triton_kernel import paged_attention  # noqa: PLC0415

        self._paged_attention = paged_attention

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        cache: LayerCache,
        metadata: AttentionMetadata,
        params: AttentionParams,
    ) -> torch.Tensor:
        """Writes the step's K/V at `slot_mapping`, then runs the kernel over every sequence's block table."""
        write_step_kv(cache, key, value, metadata.slot_mapping)
        return self._paged_attention(query.contiguous(), cache.key, cache.value, metadata.paged, params)
