"""Test helpers for vision-language models: a tiny random LLaVA checkpoint, image files, and requests carrying them."""

from __future__ import annotations

import dataclasses
import hashlib
import io
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from shard_testing import CPU, TINY_SETTINGS, StepDriver, load_tiny_model, new_request, recorded_logits, warmed
from tandem_server.engine.companions import Companions
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.engine.step import ImageInput, NewRequest
from tandem_server.models.config import read_checkpoint_config
from tandem_server.vision.loader import load_image_embedder
from transformers import (
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
)

IMAGE_TOKEN = 95
# 56x56 pixels in 14x14 patches; "default" drops the class token.
TOKENS_PER_IMAGE = 16
IMAGE_SIZE = 56

TINY_VISION: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": IMAGE_SIZE,
    "patch_size": 14,
}


def write_tiny_llava(path: Path, seed: int = 0, **overrides: Any) -> LlavaForConditionalGeneration:
    """Saves a random LLaVA (a 2-layer CLIP tower, a tiny Llama) with its CLIP image processor into `path` and
    returns the transformers reference. Every norm is randomised, so one loaded wrongly cannot go unnoticed."""
    torch.manual_seed(seed)
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(**TINY_VISION),
        text_config=LlamaConfig(**TINY_SETTINGS),
        image_token_index=IMAGE_TOKEN,
        **overrides,
    )
    reference = LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.2)
    reference.save_pretrained(path)
    processor = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    processor.save_pretrained(path)
    return reference


def image_file(seed: int, size: tuple[int, int] = (90, 70), file_format: str = "PNG") -> bytes:
    """An encoded image of random pixels."""
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (size[1], size[0], 3), generator=generator, dtype=torch.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(buffer, format=file_format)
    return buffer.getvalue()


def image_input(data: bytes, offset: int, num_tokens: int = TOKENS_PER_IMAGE) -> ImageInput:
    return ImageInput(data=data, digest=hashlib.sha256(data).digest(), offset=offset, num_tokens=num_tokens)


def prompt_with_images(parts: list[list[int] | bytes]) -> tuple[list[int], tuple[ImageInput, ...]]:
    """The token ids of text runs and images in order (each image a span of the image token), and the images."""
    tokens: list[int] = []
    images = []
    for part in parts:
        if isinstance(part, bytes):
            images.append(image_input(part, len(tokens)))
            tokens.extend([IMAGE_TOKEN] * TOKENS_PER_IMAGE)
        else:
            tokens.extend(part)
    return tokens, tuple(images)


def image_request(
    request_id: int, tokens: list[int], images: tuple[ImageInput, ...], max_new_tokens: int = 8, **options: Any
) -> NewRequest:
    """A greedy request whose prompt carries `images`."""
    return dataclasses.replace(new_request(request_id, tokens, max_new_tokens, **options), images=images)


def reference_pixels(checkpoint: Path, files: list[bytes]) -> torch.Tensor:
    """What transformers' own image processor makes of the files, stacked."""
    processor = CLIPImageProcessorPil.from_pretrained(checkpoint)
    images = [Image.open(io.BytesIO(data)).convert("RGB") for data in files]
    return processor(images=images, return_tensors="pt")["pixel_values"]


def make_llava_runner(path: Path, encoder_cache_bytes: int = 1 << 20) -> ModelRunner:
    """A warmed-up float32 CPU runner of the LLaVA checkpoint at `path`, encoding its images."""
    checkpoint = read_checkpoint_config(path)
    images = load_image_embedder(checkpoint, torch.float32, CPU, encoder_cache_bytes)
    options = ExecutionOptions(kv_cache_memory=4 << 20)
    runner = ModelRunner(
        load_tiny_model(path), checkpoint.eos_token_ids, torch.float32, CPU, options, Companions(images=images)
    )
    return warmed(runner)


def generate_alone(runner: ModelRunner, request: NewRequest, chunk_size: int) -> tuple[list[int], list[torch.Tensor]]:
    """The tokens of `request`, its prompt run in chunks of `chunk_size`, and the logits each of its draws read."""
    with recorded_logits(runner) as logits:
        driver = StepDriver(runner, runner.cache.num_blocks if runner.cache else 0, chunk_size)
        done = driver.run([request])
    return done[request.id], logits
