"""The paged KV cache: per layer, key and value tensors `[num_blocks + 1, block_size, kv_heads, head_dim]` (the
heads may differ by layer), or for multi-head latent attention one tensor of latent and rotary-key rows
`[num_blocks + 1, block_size, 1, head_dim]`. Every layer indexes the same block ids, so a block holds `block_size`
tokens of every layer whatever their shapes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem_server.layers.attention import LayerCache
from tandem_server.layers.attention.latent_cache import LatentLayerCache
from tandem_server.lazy_zeros import lazy_zeros
from tandem_server.models.config import ModelSpec


@dataclass(frozen=True)
class CacheGeometry:
    """Everything that fixes the size of one block across all layers."""

    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    # Set for a multi-head latent attention model (`ModelSpec.latent_dim`): one row per token, no separate values.
    latent_dim: int | None = None
    # Per layer (kv heads, head_dim) where layers differ (`ModelSpec.cache_layers`); None: every layer has
    # (`num_kv_heads`, `head_dim`). When set, `num_layers` is its length.
    layer_shapes: tuple[tuple[int, int], ...] | None = None

    @classmethod
    def of(cls, spec: ModelSpec, block_size: int, dtype: torch.dtype) -> CacheGeometry:
        """The geometry of `spec`'s cache in blocks of `block_size` tokens kept in `dtype`."""
        shapes = spec.cache_layers
        num_layers = spec.num_layers if shapes is None else len(shapes)
        return cls(num_layers, block_size, spec.num_kv_heads, spec.head_dim, dtype, spec.latent_dim, shapes)

    @property
    def shapes(self) -> tuple[tuple[int, int], ...]:
        """(kv heads, head_dim) of every layer."""
        if self.layer_shapes is not None:
            return self.layer_shapes
        return ((self.num_kv_heads, self.head_dim),) * self.num_layers

    @property
    def tensors_per_layer(self) -> int:
        return 1 if self.latent_dim is not None else 2

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token takes in the cache, all layers together."""
        element_size = torch.empty((), dtype=self.dtype).element_size()
        features = sum(kv_heads * head_dim for kv_heads, head_dim in self.shapes)
        return self.tensors_per_layer * features * element_size

    @property
    def bytes_per_block(self) -> int:
        return self.block_size * self.bytes_per_token


class KVCache:
    """Blocks 0..num_blocks-1 belong to the router; block `num_blocks` is reserved for health checks.

    The tensors start zeroed; on the CPU a block's memory becomes resident when the block is first written.
    """

    def __init__(self, geometry: CacheGeometry, num_blocks: int, device: torch.device) -> None:
        self.geometry = geometry
        self.num_blocks = num_blocks
        rows = (num_blocks + 1, geometry.block_size)
        latent_dim = geometry.latent_dim
        self.layers: list[LayerCache] = [
            LayerCache(
                key=lazy_zeros((*rows, *shape), geometry.dtype, device),
                value=lazy_zeros((*rows, *shape), geometry.dtype, device),
            )
            if latent_dim is None
            else LatentLayerCache.of(lazy_zeros((*rows, *shape), geometry.dtype, device), latent_dim)
            for shape in geometry.shapes
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
