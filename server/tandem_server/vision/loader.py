"""Builds a vision-language checkpoint's image side: its vision family's encoder, the image processor, the cache."""

from __future__ import annotations

import logging

import torch

from tandem_server.models.config import CheckpointConfig
from tandem_server.vision.embedder import ImageEmbedder
from tandem_server.vision.encoder_cache import EncoderCache
from tandem_server.vision.gemma3 import Gemma3ImageEncoder
from tandem_server.vision.image_encoder import ImageEncoder
from tandem_server.vision.llava import LlavaImageEncoder
from tandem_server.vision.preprocess import ImagePreprocessor
from tandem_server.vision.qwen2_5_vl import Qwen2_5_VLImageEncoder
from tandem_server.weights.loader import load_weights

logger = logging.getLogger(__name__)

# Maps `config.architectures[0]` to the vision family encoding its images; each is built from config.json whole and
# the hidden size of the text decoder it feeds.
VISION_FAMILIES: dict[str, type[ImageEncoder]] = {
    "Gemma3ForConditionalGeneration": Gemma3ImageEncoder,
    "LlavaForConditionalGeneration": LlavaImageEncoder,
    "Qwen2_5_VLForConditionalGeneration": Qwen2_5_VLImageEncoder,
}


def attends_bidirectionally_within_images(architecture: str) -> bool:
    """Whether the checkpoint's text decoder lets each image span's positions see each other both ways, which the
    attention backend must then serve."""
    family = VISION_FAMILIES.get(architecture)
    return family is not None and family.bidirectional_spans


def load_image_embedder(
    checkpoint: CheckpointConfig, dtype: torch.dtype, device: torch.device, cache_bytes: int
) -> ImageEmbedder | None:
    """The image side of a vision-language checkpoint, in `dtype` on `device` and whole on every rank, with an
    encoder cache of `cache_bytes`; None for a model that takes text only."""
    factory = VISION_FAMILIES.get(checkpoint.architecture)
    if factory is None or checkpoint.whole_hf is None:
        return None
    previous_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        # Built without values, then given uninitialised storage that the checkpoint fills.
        with torch.device("meta"):
            encoder = factory(checkpoint.whole_hf, int(checkpoint.hf["hidden_size"]))
    finally:
        torch.set_default_dtype(previous_dtype)
    encoder = encoder.to_empty(device=device).requires_grad_(False)
    load_weights(encoder, checkpoint.path, encoder.checkpoint_layout())
    preprocessor = ImagePreprocessor(checkpoint.path, encoder.image_size, encoder.processor_options)
    logger.info("%s: encoding images with %s", checkpoint.architecture, encoder.description)
    return ImageEmbedder(encoder.eval(), preprocessor, EncoderCache(cache_bytes), device)
