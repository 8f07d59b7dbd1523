"""Per-layer input embeddings (Gemma 4): every decoder layer gets a small extra input per token, mixing a token
table lookup with a projection of the token's embedding."""

from __future__ import annotations

import torch
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.layers.embedding import Embedding
from tandem_server.layers.linear import ReplicatedLinear
from tandem_server.layers.norm import RMSNorm

# The two terms are averaged in energy: their sum is scaled by 1/sqrt(2).
COMBINED_SCALE = 2.0**-0.5


class PerLayerInputs(nn.Module):
    """`[tokens, layers, size]`: (norm(projection(embedding) / sqrt(hidden)) + table(token) * sqrt(size)) / sqrt(2).

    The token table is split by vocabulary across ranks like the main embedding; the projection is small and every
    rank holds it whole.
    """

    def __init__(
        self, vocab_size: int, num_layers: int, size: int, hidden_size: int, eps: float, parallel: ParallelContext
    ) -> None:
        super().__init__()
        self.num_layers, self.size = num_layers, size
        self.embed_tokens_per_layer = Embedding(vocab_size, num_layers * size, parallel)
        self.per_layer_model_projection = ReplicatedLinear(hidden_size, num_layers * size)
        self.per_layer_projection_norm = RMSNorm(size, eps, float32_scale=True)
        # The reference multiplies the table rows by the scale rounded to the model dtype.
        self.token_scale = torch.tensor(size**0.5, dtype=torch.get_default_dtype()).item()
        self.projection_scale = hidden_size**-0.5

    def forward(self, input_ids: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """Each token's input to each layer, from its id and its scaled embedding `[tokens, hidden]`."""
        shape = (input_ids.shape[0], self.num_layers, self.size)
        from_tokens = (self.embed_tokens_per_layer(input_ids) * self.token_scale).reshape(shape)
        projected = (self.per_layer_model_projection(embeddings) * self.projection_scale).reshape(shape)
        return (self.per_layer_projection_norm(projected) + from_tokens) * COMBINED_SCALE
