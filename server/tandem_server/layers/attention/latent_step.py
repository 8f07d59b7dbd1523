"""What a multi-head latent attention (MLA) layer asks of the attention backend: which rows of a step are prompt
chunks (expanded form, attended by the layer itself) and which are decodes, and the absorbed-form attention of the
decode rows over the paged latent cache (the backend's own kernel)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from tandem_server.layers.attention.latent_cache import LatentLayerCache
from tandem_server.layers.attention.metadata import AttentionMetadata
from tandem_server.layers.attention.torch_metadata import PrefillSpan


@dataclass(frozen=True)
class LatentLayout:
    """A step's rows as a latent attention layer splits them."""

    # Sequences of several query tokens, attended in expanded form from their context's cached rows.
    prefills: tuple[PrefillSpan, ...]
    # The query rows of the single-token sequences, in the order `absorbed_decode` takes them: a tensor of row
    # indices, `slice(None)` when every row of the step is one, or None when the step has none.
    decode_rows: torch.Tensor | slice | None


@runtime_checkable
class AbsorbedDecoding(Protocol):
    """An attention backend that serves MLA: it splits a step's rows and attends decode rows in absorbed form."""

    def latent_layout(self, metadata: AttentionMetadata) -> LatentLayout:
        """The step's prompt chunks and decode rows, from the metadata this backend's `prepare` built."""
        ...

    def absorbed_decode(
        self, query: torch.Tensor, cache: LatentLayerCache, metadata: AttentionMetadata, scale: float
    ) -> torch.Tensor:
        """`query` [decodes, heads, latent_dim + rope_dim] (each head's query in latent space, then its rotated
        rotary part; rows in `decode_rows` order) attends to its sequence's cached rows: the whole row as the key,
        the latent as the value -> [decodes, heads, latent_dim], in the query's dtype."""
        ...
