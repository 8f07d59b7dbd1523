"""The paged KV cache: per layer, key and value tensors `[num_blocks + 1, block_size, kv_heads, head_dim]`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem_server.layers.attention import LayerCache
from tandem_server.lazy_zeros import lazy_zeros


@dataclass(frozen=True)
class CacheGeometry:
    """Everything that fixes the size of one block across all layers."""

    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_block(self) -> int:
        element_size = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * element_size


class KVCache:
    """Blocks 0..num_blocks-1 belong to the router; block `num_blocks` is reserved for health checks.

    The tensors start zeroed; on the CPU a block's memory becomes resident when the block is first written.
    """

    def __init__(self, geometry: CacheGeometry, num_blocks: int, device: torch.device) -> None:
        self.geometry = geometry
        self.num_blocks = num_blocks
        shape = (num_blocks + 1, geometry.block_size, geometry.num_kv_heads, geometry.head_dim)
        self.layers = [
            LayerCache(
                key=lazy_zeros(shape, geometry.dtype, device),
                value=lazy_zeros(shape, geometry.dtype, device),
            )
            for _ in range(geometry.num_layers)
        ]

    @property
    def block_size(self) -> int:
        return self.geometry.block_size

    @property
    def reserved_block(self) -> int:
        return self.num_blocks

    @property
    def nbytes(self) -> int:
        return (self.num_blocks + 1) * self.geometry.bytes_per_block
