"""The paged cache of a multi-head latent attention (MLA) layer: one row per token instead of per-head keys and
values."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem_server.layers.attention.backend import LayerCache


@dataclass(frozen=True)
class LatentLayerCache(LayerCache):
    """`key` holds each token's compressed latent then its rotary key `[blocks, block_size, 1, latent_dim +
    rope_dim]`; `value` is a view of its latent part, since in the absorbed form the latent is what every head
    attends to as its value. One tensor's memory."""

    @classmethod
    def of(cls, rows: torch.Tensor, latent_dim: int) -> LatentLayerCache:
        """The layer cache over `rows` `[blocks, block_size, 1, latent_dim + rope_dim]`."""
        return cls(key=rows, value=rows[..., :latent_dim])

    def flat_rows(self) -> torch.Tensor:
        """Every slot's row `[slots, latent_dim + rope_dim]` (slot = block * block_size + offset), as a view."""
        return self.key.view(-1, self.key.shape[-1])
