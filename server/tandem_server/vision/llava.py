"""LLaVA's vision side: a CLIP tower whose selected hidden states, concatenated per token, pass through the
multimodal projector."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from tandem_server.vision.clip import ClipVisionTower
from tandem_server.vision.config import llava_args
from tandem_server.vision.image_encoder import ImageEncoder, tower_and_projector_layout
from tandem_server.vision.projector import LlavaProjector
from tandem_server.weights.layout import CheckpointLayout


class LlavaImageEncoder(ImageEncoder):
    """The CLIP tower up to the deepest selected layer, then the projector."""

    def __init__(self, hf_config: dict[str, Any], text_hidden_size: int) -> None:
        super().__init__()
        args = llava_args(hf_config, text_hidden_size)
        self.args = args
        self.image_size = args.vision.image_size
        self.image_token_id = args.image_token_id
        self.description = f"CLIPVisionModel, {args.vision.num_layers} layers"
        self.vision_tower = ClipVisionTower(args.vision, args.depth)
        features = args.vision.hidden_size * len(args.feature_layers)
        self.multi_modal_projector = LlavaProjector(features, text_hidden_size, args.projector_act, args.projector_bias)

    def forward(self, pixels: Mapping[str, torch.Tensor]) -> torch.Tensor:
        states = self.vision_tower(pixels["pixel_values"], self.args.feature_layers)
        if not self.args.keep_class_token:
            states = [state[:, 1:] for state in states]
        return self.multi_modal_projector(torch.cat(states, dim=-1))[0]

    def checkpoint_layout(self) -> CheckpointLayout:
        """The tower and projector under either naming; the tower layers past the deepest selected one and the
        final norm are skipped."""
        unused_layers = tuple(
            f"vision_tower.encoder.layers.{index}." for index in range(self.args.depth, self.args.vision.num_layers)
        )
        return tower_and_projector_layout(skipped_prefixes=(*unused_layers, "vision_tower.post_layernorm."))
