"""Attention with torch SDPA over the paged cache: one call per prompt chunk, one padded call for decodes."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tandem_server.layers.attention.backend import LayerCache
from tandem_server.layers.attention.metadata import AttentionMetadata


class TorchAttentionBackend:
    """Portable backend for CPU and as a CUDA fallback."""

    name = "torch"

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        cache: LayerCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Writes the step's K/V at `slot_mapping`, then attends each query through its request's slots."""
        num_kv_heads, head_dim = cache.key.shape[-2:]
        key_slots = cache.key.view(-1, num_kv_heads, head_dim)
        value_slots = cache.value.view(-1, num_kv_heads, head_dim)
        key_slots.index_copy_(0, metadata.slot_mapping, key.to(key_slots.dtype))
        value_slots.index_copy_(0, metadata.slot_mapping, value.to(value_slots.dtype))

        output = torch.empty_like(query)
        for span in metadata.prefills:
            rows = slice(span.query_start, span.query_start + span.query_len)
            q = query[rows].transpose(0, 1).unsqueeze(0)
            k = key_slots[span.key_slots].transpose(0, 1).unsqueeze(0)
            v = value_slots[span.key_slots].transpose(0, 1).unsqueeze(0)
            output[rows] = _attend(q, k, v, span.mask)[0].transpose(0, 1)
        decode = metadata.decode
        if decode is not None:
            q = query[decode.query_rows].unsqueeze(2)
            k = key_slots[decode.key_slots].transpose(1, 2)
            v = value_slots[decode.key_slots].transpose(1, 2)
            output[decode.query_rows] = _attend(q, k, v, decode.key_mask).squeeze(2)
        return output


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    # q [batch, heads, q_len, dim]; k/v [batch, kv_heads, k_len, dim]; grouped heads share a kv head.
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask, is_causal=mask is None)
