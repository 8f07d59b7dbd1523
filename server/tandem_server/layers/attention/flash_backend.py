"""Attention through flash-attn's varlen kernel (CUDA, fp16/bf16); flash-attn is the optional `cuda` extra."""

from __future__ import annotations

import torch

from tandem_server.layers.attention.backend import AttentionParams, LayerCache, write_step_kv
from tandem_server.layers.attention.metadata import AttentionMetadata, PagedLayout

# flash-attn 2 reads a paged cache through `block_table` only when a block holds a multiple of 256 tokens.
FLASH_PAGE_MULTIPLE = 256


class FlashAttentionBackend:
    """Mixed prefill/decode steps in one varlen call; causal masks align to each sequence's end (cached prefixes)."""

    name = "flash"
    uses_slot_lists = False
    # The varlen call takes host integers (max lengths) that change every step, so steps run eagerly.
    supports_cuda_graphs = False

    def __init__(self) -> None:
        # Imported here: the module loads on machines without flash-attn, selection decides whether it is built.
        from flash_attn import flash_attn_varlen_func  # noqa: PLC0415

        self._varlen = flash_attn_varlen_func

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        cache: LayerCache,
        metadata: AttentionMetadata,
        params: AttentionParams,
    ) -> torch.Tensor:
        """Writes the step's K/V, then attends through the block tables (or a gather when blocks are small)."""
        write_step_kv(cache, key, value, metadata.slot_mapping)
        paged = metadata.paged
        block_size = cache.key.shape[1]
        window = (params.sliding_window - 1, 0) if params.sliding_window is not None else (-1, -1)
        common = {
            "cu_seqlens_q": paged.query_start_loc,
            "cu_seqlens_k": paged.seq_start_loc,
            "max_seqlen_q": paged.max_query_len,
            "max_seqlen_k": paged.max_seq_len,
            "softmax_scale": params.scale,
            "causal": True,
            "window_size": window,
            "softcap": params.logit_softcap or 0.0,
        }
        if block_size % FLASH_PAGE_MULTIPLE == 0:
            return self._varlen(query, cache.key, cache.value, block_table=paged.block_tables, **common)
        slots = context_slots(paged, block_size)
        num_kv_heads, head_dim = cache.key.shape[-2:]
        keys = cache.key.view(-1, num_kv_heads, head_dim)[slots]
        values = cache.value.view(-1, num_kv_heads, head_dim)[slots]
        return self._varlen(query, keys, values, **common)


def context_slots(paged: PagedLayout, block_size: int) -> torch.Tensor:
    """Flat cache slots of every sequence's positions [0, seq_len), concatenated in batch order."""
    device = paged.seq_lens.device
    sequence = torch.repeat_interleave(
        torch.arange(paged.num_seqs, device=device), paged.seq_lens.long(), output_size=paged.num_keys
    )
    position = torch.arange(paged.num_keys, device=device) - paged.seq_start_loc[sequence].long()
    block = paged.block_tables[sequence, position // block_size].long()
    return block * block_size + position % block_size
