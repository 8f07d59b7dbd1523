"""CLIP's vision transformer: patch embedding, class token and learned positions, pre-norm encoder layers.

Every rank holds all of it (no tensor-parallel slicing): an image is encoded once per rank, identically.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tandem_server.layers.activation import activation
from tandem_server.vision.config import VitArgs


class ClipEmbeddings(nn.Module):
    """Non-overlapping patches projected to the hidden size, after a learned class token, plus learned positions."""

    def __init__(self, args: VitArgs) -> None:
        super().__init__()
        self.class_embedding = nn.Parameter(torch.empty(args.hidden_size), requires_grad=False)
        self.patch_embedding = nn.Conv2d(
            args.num_channels, args.hidden_size, args.patch_size, stride=args.patch_size, bias=False
        )
        self.position_embedding = nn.Embedding(args.num_patches + 1, args.hidden_size)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2)
        class_token = self.class_embedding.expand(patches.shape[0], 1, -1)
        return torch.cat([class_token, patches], dim=1) + self.position_embedding.weight


class ClipAttention(nn.Module):
    """Bidirectional multi-head self-attention over one image's tokens."""

    def __init__(self, args: VitArgs) -> None:
        super().__init__()
        self.num_heads = args.num_heads
        self.head_dim = args.hidden_size // args.num_heads
        self.q_proj = nn.Linear(args.hidden_size, args.hidden_size)
        self.k_proj = nn.Linear(args.hidden_size, args.hidden_size)
        self.v_proj = nn.Linear(args.hidden_size, args.hidden_size)
        self.out_proj = nn.Linear(args.hidden_size, args.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        images, tokens, _ = hidden.shape
        shape = (images, tokens, self.num_heads, self.head_dim)
        query, key, value = (
            proj(hidden).view(shape).transpose(1, 2) for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        attended = F.scaled_dot_product_attention(query, key, value, scale=self.head_dim**-0.5)
        return self.out_proj(attended.transpose(1, 2).reshape(images, tokens, -1))


class ClipMlp(nn.Module):
    def __init__(self, args: VitArgs) -> None:
        super().__init__()
        self.fc1 = nn.Linear(args.hidden_size, args.intermediate_size)
        self.fc2 = nn.Linear(args.intermediate_size, args.hidden_size)
        self.act = activation(args.hidden_act)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(hidden)))


class ClipEncoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks, each with a residual connection."""

    def __init__(self, args: VitArgs) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.self_attn = ClipAttention(args)
        self.layer_norm2 = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.mlp = ClipMlp(args)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.layer_norm1(hidden))
        return hidden + self.mlp(self.layer_norm2(hidden))


class ClipEncoder(nn.Module):
    """`depth` encoder layers, parameter names as CLIP's and SigLIP's checkpoints give them (their layers are the
    same)."""

    def __init__(self, args: VitArgs, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ClipEncoderLayer(args) for _ in range(depth))


class ClipVisionTower(nn.Module):
    """The first `depth` layers of a CLIP vision transformer; parameter names follow the checkpoint's (its final
    layers and `post_layernorm`, which no selected hidden state reads, are not built)."""

    def __init__(self, args: VitArgs, depth: int) -> None:
        super().__init__()
        self.embeddings = ClipEmbeddings(args)
        self.pre_layrnorm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.encoder = ClipEncoder(args, depth)

    def forward(self, pixels: torch.Tensor, selected: tuple[int, ...]) -> list[torch.Tensor]:
        """Hidden states `[images, 1 + patches, hidden]` at the `selected` indices (0: the normalised embeddings,
        i: layer i's output), in the order given."""
        hidden = self.pre_layrnorm(self.embeddings(pixels))
        states = [hidden]
        for layer in self.encoder.layers:
            hidden = layer(hidden)
            states.append(hidden)
        return [states[index] for index in selected]
