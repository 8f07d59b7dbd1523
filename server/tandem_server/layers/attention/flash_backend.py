"""Attention through FlashAttention's paged varlen kernel (CUDA, fp16/bf16): flash-attn 2 or flash-attn-4.

Both releases read the block tables directly, so no step gathers its context: flash-attn 2 when a block holds a
multiple of 256 tokens, flash-attn-4 (CuTe DSL, Hopper and Blackwell) at any block size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from tandem_server.errors import ConfigError
from tandem_server.interfaces.attention import BackendSettings, PackageRelease, choose_release
from tandem_server.interfaces.attention_registry import FLASH_ATTN_2, FLASH_ATTN_4, FLASH_CAPABILITIES
from tandem_server.layers.attention.backend import (
    AttentionParams,
    LayerCache,
    PreparedStep,
    write_step_kv,
)
from tandem_server.layers.attention.metadata import AttentionMetadata


@dataclass(frozen=True)
class FlashAttentionMetadata(AttentionMetadata):
    """The common metadata plus the key offsets flash-attn 2 reads (flash-attn-4 reads `seq_lens` instead)."""

    # [sequences + 1] int32: cumulative seq_lens, the `cu_seqlens_k` of flash-attn 2's varlen API.
    key_start_loc: torch.Tensor | None = None


class FlashAttentionBackend:
    """Mixed prefill/decode steps in one paged varlen call; causal masks align to each sequence's end."""

    name = "flash"
    capabilities = FLASH_CAPABILITIES
    # Every call reads only device tensors plus host bounds that are fixed for a captured batch size.
    supports_cuda_graphs = FLASH_CAPABILITIES.cuda_graphs

    def __init__(self, release: PackageRelease | None = None) -> None:
        if release is None:
            release, problems = choose_release(FLASH_CAPABILITIES.releases, torch.cuda.get_device_capability())
            if release is None:
                raise ConfigError(f"no usable FlashAttention release: {'; '.join(problems)}")
        self.release = release
        self._attend = _ATTEND[release.name](release.load())

    @classmethod
    def from_settings(cls, settings: BackendSettings) -> FlashAttentionBackend:
        """The newest release with kernels for this GPU; it reads none of the settings."""
        return cls()

    def prepare(self, metadata: AttentionMetadata, layers: Sequence[LayerCache]) -> PreparedStep:
        """For flash-attn 2, the key offsets, summed on the device so a captured graph sums them again at every
        replay."""
        if self.release != FLASH_ATTN_2:
            return PreparedStep(metadata, layers)
        key_start_loc = F.pad(metadata.paged.seq_lens.cumsum(0, dtype=torch.int32), (1, 0))
        flash = FlashAttentionMetadata(
            slot_mapping=metadata.slot_mapping, paged=metadata.paged, host=metadata.host, key_start_loc=key_start_loc
        )
        return PreparedStep(flash, layers)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        cache: LayerCache,
        metadata: AttentionMetadata,
        params: AttentionParams,
    ) -> torch.Tensor:
        """Writes the step's K/V, then attends through the block tables."""
        if params.sinks is not None:
            raise ValueError("the flash attention backend cannot add attention sinks")
        block_size = cache.key.shape[1]
        problem = self.release.page_problem(block_size)
        if problem is not None:
            raise ConfigError(f"{problem}; start with --block-size {self.release.pages.multiple}")
        write_step_kv(cache, key, value, metadata.slot_mapping)
        return self._attend(query, cache, metadata, params)


Attend = Callable[[torch.Tensor, LayerCache, AttentionMetadata, AttentionParams], torch.Tensor]


def _flash_attn_2(varlen: Callable[..., Any]) -> Attend:
    def attend(
        query: torch.Tensor, cache: LayerCache, metadata: AttentionMetadata, params: AttentionParams
    ) -> torch.Tensor:
        if not isinstance(metadata, FlashAttentionMetadata) or metadata.key_start_loc is None:
            raise TypeError("invariant: flash-attn 2 attends with the metadata the flash backend's `prepare` built")
        paged = metadata.paged
        window = (params.sliding_window - 1, 0) if params.sliding_window is not None else (-1, -1)
        return varlen(
            query,
            cache.key,
            cache.value,
            cu_seqlens_q=paged.query_start_loc,
            cu_seqlens_k=metadata.key_start_loc,
            max_seqlen_q=paged.max_query_len,
            max_seqlen_k=paged.max_seq_len,
            softmax_scale=params.scale,
            causal=True,
            window_size=window,
            softcap=params.logit_softcap or 0.0,
            block_table=paged.block_tables,
        )

    return attend


def _flash_attn_4(varlen: Callable[..., Any]) -> Attend:
    def attend(
        query: torch.Tensor, cache: LayerCache, metadata: AttentionMetadata, params: AttentionParams
    ) -> torch.Tensor:
        paged = metadata.paged
        # With a page table the key lengths come from seqused_k; cu_seqlens_k must stay unset.
        window = (params.sliding_window - 1, 0) if params.sliding_window is not None else (None, None)
        output, _ = varlen(
            query,
            cache.key,
            cache.value,
            cu_seqlens_q=paged.query_start_loc,
            max_seqlen_q=paged.max_query_len,
            max_seqlen_k=paged.max_seq_len,
            seqused_k=paged.seq_lens,
            page_table=paged.block_tables,
            softmax_scale=params.scale,
            causal=True,
            window_size=window,
            softcap=params.logit_softcap or 0.0,
        )
        return output

    return attend


_ATTEND: dict[str, Callable[[Callable[..., Any]], Attend]] = {
    FLASH_ATTN_2.name: _flash_attn_2,
    FLASH_ATTN_4.name: _flash_attn_4,
}
