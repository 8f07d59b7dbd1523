"""What the shard needs from a vision family: a module turning preprocessed pixels into text-model embeddings."""

from __future__ import annotations

import torch
from torch import nn

from tandem_server.weights.layout import CheckpointLayout


class ImageEncoder(nn.Module):
    """The base of every vision family (its vision tower and projector). The attributes are set by the family's
    constructor; the two methods are the family's to define."""

    # The square side, in pixels, of the images the tower reads.
    image_size: int
    # The token id a prompt holds at every position of an image's span.
    image_token_id: int
    # "<encoder architecture>, <N> layers", as Info reports it.
    description: str

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """The embeddings `[images, tokens, text hidden]` of preprocessed `pixels` `[images, channels, side, side]`,
        in the text model's input space."""
        raise NotImplementedError

    def checkpoint_layout(self) -> CheckpointLayout:
        """Which checkpoint tensors are this module's parameters, and under which names."""
        raise NotImplementedError
