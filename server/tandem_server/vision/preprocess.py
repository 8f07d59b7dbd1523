"""Turns an encoded image file into the pixels a vision tower reads, with the checkpoint's own image processor."""

from __future__ import annotations

import io
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from tandem_server.errors import ConfigError, ImageError

logger = logging.getLogger(__name__)

# What PIL raises on a file it cannot read: unknown or truncated data (OSError and its UnidentifiedImageError), a
# malformed chunk (SyntaxError, ValueError), data that ends early (EOFError), or a decompression bomb.
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)


def decode_image(data: bytes) -> Image.Image:
    """The RGB image in the file `data` (a GIF's first frame), or an ImageError saying why it cannot be read."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.convert("RGB")
    except _DECODE_ERRORS as error:
        raise ImageError(f"the image cannot be decoded ({error})") from error


def image_dimensions(data: bytes) -> tuple[int, int]:
    """The width and height of the image in the file `data`, read from its header without decoding its pixels; an
    ImageError when the header cannot be read."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.size
    except _DECODE_ERRORS as error:
        raise ImageError(f"the image cannot be decoded ({error})") from error


class ImagePreprocessor:
    """The checkpoint's `preprocessor_config.json` as transformers' image processor applies it, on its PIL backend
    (resize, crop, rescale, normalise: the same pixels as the reference implementation), called with the vision
    family's `options` over what the file says. A tower reading square images of `image_size` pixels is checked to
    get them; None: the tower reads images of any size (dynamic resolution)."""

    def __init__(self, model_path: Path, image_size: int | None, options: Mapping[str, Any] | None = None) -> None:
        # Imported here: transformers' image processors import its modeling code and with it torch's compiler stack
        # (about 200 MiB), which only a shard serving images should pay for.
        from transformers import AutoImageProcessor  # noqa: PLC0415

        try:
            self._processor = AutoImageProcessor.from_pretrained(model_path, backend="pil")
        except (OSError, ValueError) as error:
            raise ConfigError(
                f"{model_path}: its image processor cannot be loaded ({error}); a vision-language checkpoint needs "
                "its preprocessor_config.json"
            ) from error
        self._options = dict(options or {})
        self._log_overridden_options(model_path)
        self.image_size = image_size
        if image_size is None:
            return
        side = tuple(self.inputs(Image.new("RGB", (image_size + 5, image_size - 3)))["pixel_values"].shape[-2:])
        if side != (image_size, image_size):
            raise ConfigError(
                f"{model_path}: its image processor makes {side[0]}x{side[1]} pixel images, its vision tower reads "
                f"{image_size}x{image_size}"
            )

    @property
    def processor(self) -> Any:
        """transformers' image processor itself, for the sizes a vision family reads from it."""
        return self._processor

    def _log_overridden_options(self, model_path: Path) -> None:
        # One line per option that changes what preprocessor_config.json asks for (Gemma 3's pan-and-scan crops).
        for name, value in self._options.items():
            configured = getattr(self._processor, name, None)
            if configured is not None and configured != value:
                logger.info(
                    "%s: images are preprocessed with %s=%s, not %s as configured", model_path, name, value, configured
                )

    def inputs(self, image: Image.Image) -> dict[str, torch.Tensor]:
        """The image processor's outputs for `image`: float32 `pixel_values` (`[1, channels, side, side]` for a
        square tower) and whatever else it gives (Qwen2-VL's `image_grid_thw`), as tensors."""
        try:
            outputs = self._processor(images=image, return_tensors="pt", **self._options)
        except (ValueError, OSError) as error:
            raise ImageError(f"the image cannot be preprocessed ({error})") from error
        tensors = {name: torch.as_tensor(value) for name, value in outputs.items()}
        tensors["pixel_values"] = tensors["pixel_values"].to(torch.float32)
        return tensors
