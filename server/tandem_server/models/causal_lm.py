"""What the engine needs from a model family: a torch module over a flat batch of tokens from many requests."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from tandem_server.layers.attention import AttentionBackend, AttentionMetadata, LayerCache
from tandem_server.layers.embedding import InputEmbeddings
from tandem_server.layers.recurrent.state_pool import StepStates
from tandem_server.models.config import ModelSpec
from tandem_server.weights.layout import CheckpointLayout


class CausalLM(nn.Module):
    """The base of every model family. `spec` and `backend` are set by the family's constructor; the three methods
    are the family's to define."""

    spec: ModelSpec
    # The attention backend every layer attends through; it prepares each step's metadata for them.
    backend: AttentionBackend

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: Sequence[LayerCache],
        metadata: AttentionMetadata,
        states: StepStates | None = None,
        embeddings: InputEmbeddings | None = None,
    ) -> torch.Tensor:
        """The final hidden state of every row; the rows' keys and values land in `kv_cache`, and the recurrent
        layers' states (of a hybrid model) in `states`. The rows `embeddings` names run on its values instead of
        their tokens' embeddings (an image's positions)."""
        raise NotImplementedError

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the vocabulary for the rows of `hidden`."""
        raise NotImplementedError

    def checkpoint_layout(self) -> CheckpointLayout:
        """How checkpoint tensors map onto this module's parameters."""
        raise NotImplementedError
