"""Gemma 3's vision side: a SigLIP tower whose patch grid is average-pooled, normalised and projected into the text
model's hidden size. Its text decoder attends bidirectionally within each image's span."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from tandem_server.layers.norm import RMSNorm
from tandem_server.vision.config import Gemma3VisionArgs, gemma3_vision_args
from tandem_server.vision.image_encoder import ImageEncoder, tower_and_projector_layout
from tandem_server.vision.siglip import SiglipVisionTower
from tandem_server.weights.layout import CheckpointLayout


class Gemma3Projector(nn.Module):
    """Average pools of the patch grid, each RMS-normalised with a `1 + weight` scale, times a
    `[vision hidden, text hidden]` matrix; replicated on every rank."""

    def __init__(self, args: Gemma3VisionArgs, text_hidden_size: int) -> None:
        super().__init__()
        self.patches_per_side = args.patches_per_side
        self.pool = nn.AvgPool2d(args.pool_size, stride=args.pool_size)
        vision_hidden = args.vision.hidden_size
        self.mm_soft_emb_norm = RMSNorm(vision_hidden, args.vision.layer_norm_eps, unit_offset=True)
        self.mm_input_projection_weight = nn.Parameter(
            torch.empty(vision_hidden, text_hidden_size), requires_grad=False
        )

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """`[images, tokens, text hidden]` from the tower's `[images, patches, vision hidden]`, patches row-major."""
        images, _, hidden = patches.shape
        grid = patches.transpose(1, 2).reshape(images, hidden, self.patches_per_side, self.patches_per_side)
        pooled = self.pool(grid).flatten(2).transpose(1, 2)
        return (self.mm_soft_emb_norm(pooled) @ self.mm_input_projection_weight).to(patches.dtype)


class Gemma3ImageEncoder(ImageEncoder):
    """The whole SigLIP tower, then the pooling projector; images are read whole, without pan-and-scan crops."""

    bidirectional_spans = True
    processor_options: ClassVar[Mapping[str, Any]] = {"do_pan_and_scan": False}

    def __init__(self, hf_config: dict[str, Any], text_hidden_size: int) -> None:
        super().__init__()
        args = gemma3_vision_args(hf_config)
        self.image_size = args.vision.image_size
        self.image_token_id = args.image_token_id
        self.description = f"SiglipVisionModel, {args.vision.num_layers} layers"
        self.vision_tower = SiglipVisionTower(args.vision)
        self.multi_modal_projector = Gemma3Projector(args, text_hidden_size)

    def forward(self, pixels: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.multi_modal_projector(self.vision_tower(pixels["pixel_values"]))[0]

    def checkpoint_layout(self) -> CheckpointLayout:
        """The tower and projector under either naming; an attention-pooling head, if saved, is skipped."""
        return tower_and_projector_layout(skipped_prefixes=("vision_tower.head.",))
