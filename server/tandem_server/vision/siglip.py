"""SigLIP's vision transformer: biased patch embedding and learned positions without a class token, CLIP's pre-norm
encoder layers, and a final norm.

Every rank holds all of it (no tensor-parallel slicing): an image is encoded once per rank, identically.
"""

from __future__ import annotations

import torch
from torch import nn

from tandem_server.vision.clip import ClipEncoder
from tandem_server.vision.config import VitArgs


class SiglipEmbeddings(nn.Module):
    """Non-overlapping patches projected to the hidden size, plus one learned position per patch."""

    def __init__(self, args: VitArgs) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv2d(args.num_channels, args.hidden_size, args.patch_size, stride=args.patch_size)
        self.position_embedding = nn.Embedding(args.num_patches, args.hidden_size)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2)
        return patches + self.position_embedding.weight


class SiglipVisionTower(nn.Module):
    """Every layer of a SigLIP vision transformer, then `post_layernorm`; parameter names follow the checkpoint's.
    Its attention-pooling head (`vision_use_head`), which yields one vector per image, is not built."""

    def __init__(self, args: VitArgs) -> None:
        super().__init__()
        self.embeddings = SiglipEmbeddings(args)
        self.encoder = ClipEncoder(args, args.num_layers)
        self.post_layernorm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """The normalised last hidden state `[images, patches, hidden]`, patches in row-major order."""
        hidden = self.embeddings(pixels)
        for layer in self.encoder.layers:
            hidden = layer(hidden)
        return self.post_layernorm(hidden)
