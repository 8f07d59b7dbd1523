"""What the shard needs from a vision family: a module turning preprocessed pixels into text-model embeddings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from tandem_server.weights.layout import CheckpointLayout, Renamed

# transformers 5 names a vision-language checkpoint's parts under `model.`; the published checkpoints at the top level,
# with the tower's own `vision_model.` inside (LLaVA's from llava-hf, Gemma 3's). Both become the names below.
TOWER_NAMES = Renamed(r"^(model\.)?vision_tower\.(vision_model\.)?", "vision_tower.")
PROJECTOR_NAMES = Renamed(r"^(model\.)?multi_modal_projector\.", "multi_modal_projector.")
KEPT_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


def tower_and_projector_layout(skipped_prefixes: tuple[str, ...]) -> CheckpointLayout:
    """A `vision_tower` and a `multi_modal_projector` read under either naming, the renamed `skipped_prefixes` not."""
    return CheckpointLayout(
        kept_prefixes=KEPT_PREFIXES, renamed=(TOWER_NAMES, PROJECTOR_NAMES), skipped_prefixes=skipped_prefixes
    )


class ImageEncoder(nn.Module):
    """The base of every vision family (its vision tower and projector). The attributes are set by the family's
    constructor; the two methods are the family's to define."""

    # The square side, in pixels, of the images the tower reads; None: it reads images of any size.
    image_size: int | None
    # The token id a prompt holds at every position of an image's span.
    image_token_id: int
    # "<encoder architecture>, <N> layers", as Info reports it.
    description: str
    # True when the text decoder lets the positions of one image's span attend to each other in both directions
    # (Gemma 3); a step must then never end strictly inside a span, and the attention backend must apply the spans.
    bidirectional_spans: ClassVar[bool] = False
    # Arguments the image processor is always called with, whatever its preprocessor_config.json says.
    processor_options: ClassVar[Mapping[str, Any]] = {}
    # True when an image's tokens form a grid whose rows and columns the text decoder's rotary positions follow
    # (M-RoPE), and its token count depends on the image's size; the family then defines `token_grid`.
    grid_positions: ClassVar[bool] = False

    def forward(self, pixels: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The embeddings `[tokens, text hidden]` of one image preprocessed into `pixels` (the image processor's
        outputs: `pixel_values`, and whatever else the family reads), in the text model's input space."""
        raise NotImplementedError

    def token_grid(self, processor: Any, width: int, height: int) -> tuple[int, int]:
        """The rows and columns of tokens an image of `width` x `height` pixels becomes under the image `processor`
        (families with `grid_positions`)."""
        raise NotImplementedError

    def checkpoint_layout(self) -> CheckpointLayout:
        """Which checkpoint tensors are this module's parameters, and under which names."""
        raise NotImplementedError
