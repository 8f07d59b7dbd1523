"""Test helpers for vision-language models: tiny random LLaVA and Gemma 3 checkpoints, image files, and requests
carrying them."""

from __future__ import annotations

import dataclasses
import hashlib
import io
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from shard_testing import CPU, TINY_SETTINGS, StepDriver, load_tiny_model, new_request, recorded_logits, warmed
from tandem_server.config import CompileMode
from tandem_server.engine.companions import Companions
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.engine.step import ImageInput, NewRequest, ScheduledRequest, StepInput
from tandem_server.layers.attention import TorchAttentionBackend
from tandem_server.models.config import read_checkpoint_config
from tandem_server.vision.loader import load_image_embedder
from transformers import (
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3ImageProcessorPil,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    PreTrainedModel,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    SiglipVisionConfig,
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


# Gemma 3's special tokens inside the tiny vocabulary: its image soft token, and the tokens around each image span.
GEMMA3_IMAGE_TOKEN, GEMMA3_BOI_TOKEN, GEMMA3_EOI_TOKEN = 93, 91, 92
# The token the processor's "\n\n" before and after an image becomes (a plain text token here).
GEMMA3_BLANK_LINE = 10
# 64x64 pixels in 8x8 patches, average-pooled 2x2 into a 4x4 grid.
GEMMA3_IMAGE_SIZE = 64
GEMMA3_TOKENS_PER_IMAGE = 16
# Smaller than an image span, so a sliding layer's window cuts through it.
GEMMA3_WINDOW = 8

TINY_SIGLIP: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": GEMMA3_IMAGE_SIZE,
    "patch_size": 8,
}


# Qwen2.5-VL's special tokens inside the tiny vocabulary: the image pad token its spans hold, and the tokens around
# each span.
QWEN_VL_IMAGE_TOKEN, QWEN_VL_VISION_START, QWEN_VL_VISION_END = 95, 93, 94
# 4x4-pixel patches merged 2x2: an image is resized to multiples of 8 pixels holding 4 to 16 merged units.
QWEN_VL_PATCH, QWEN_VL_MERGE = 4, 2
QWEN_VL_MIN_PIXELS, QWEN_VL_MAX_PIXELS = 4 * 64, 16 * 64

TINY_QWEN_VL_VISION: dict[str, Any] = {
    "depth": 3,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_heads": 2,
    "patch_size": QWEN_VL_PATCH,
    "spatial_merge_size": QWEN_VL_MERGE,
    "temporal_patch_size": 2,
    # Windows of 2x2 merged units, smaller than most images; the middle layer attends over the whole image.
    "window_size": 16,
    "fullatt_block_indexes": [1],
    "out_hidden_size": 64,
}


def randomized_norms(reference: PreTrainedModel) -> None:
    """Shifts every norm's weights randomly (their init is constant), so a norm loaded wrongly cannot go unnoticed."""
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.2)


def randomized_constants(reference: PreTrainedModel) -> None:
    """Shifts randomly every tensor whose init holds one value (norms, biases, Gemma 3's zero projection matrix), so
    one loaded wrongly cannot go unnoticed."""
    with torch.no_grad():
        for param in reference.parameters():
            if param.numel() > 1 and bool((param == param.flatten()[0]).all()):
                param.add_(torch.randn_like(param) * 0.2)


def write_tiny_llava(path: Path, seed: int = 0, **overrides: Any) -> LlavaForConditionalGeneration:
    """Saves a random LLaVA (a 2-layer CLIP tower, a tiny Llama) with its CLIP image processor into `path` and
    returns the transformers reference."""
    torch.manual_seed(seed)
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(**TINY_VISION),
        text_config=LlamaConfig(**TINY_SETTINGS),
        image_token_index=IMAGE_TOKEN,
        **overrides,
    )
    reference = LlavaForConditionalGeneration(config).eval()
    randomized_norms(reference)
    reference.save_pretrained(path)
    processor = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    processor.save_pretrained(path)
    return reference


def write_tiny_gemma3_vision(
    path: Path, seed: int = 0, do_pan_and_scan: bool | None = None
) -> Gemma3ForConditionalGeneration:
    """Saves a random Gemma 3 (a 2-layer SigLIP tower, a sliding then a global text layer) with its image processor
    into `path` and returns the transformers reference. SiglipVisionConfig's default attention-pooling head is kept,
    so the checkpoint holds tensors the shard must skip."""
    torch.manual_seed(seed)
    # Gemma3TextConfig's own head counts, as the published configs leave them out.
    heads = {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 16}
    layer_types = ["sliding_attention", "full_attention"]
    text = {**TINY_SETTINGS, **heads, "sliding_window": GEMMA3_WINDOW, "layer_types": layer_types}
    config = Gemma3Config(
        text_config=text,
        vision_config=SiglipVisionConfig(**TINY_SIGLIP).to_dict(),
        mm_tokens_per_image=GEMMA3_TOKENS_PER_IMAGE,
        image_token_index=GEMMA3_IMAGE_TOKEN,
        boi_token_index=GEMMA3_BOI_TOKEN,
        eoi_token_index=GEMMA3_EOI_TOKEN,
    )
    config._attn_implementation = "eager"
    reference = Gemma3ForConditionalGeneration(config).eval()
    randomized_constants(reference)
    reference.save_pretrained(path)
    side = {"height": GEMMA3_IMAGE_SIZE, "width": GEMMA3_IMAGE_SIZE}
    Gemma3ImageProcessorPil(size=side, do_pan_and_scan=do_pan_and_scan).save_pretrained(path)
    return reference


def write_tiny_qwen2_5_vl(path: Path, seed: int = 0) -> Qwen2_5_VLForConditionalGeneration:
    """Saves a random Qwen2.5-VL (a 3-layer windowed vision tower, a tiny Qwen2 text decoder whose 8 rotary pairs
    split 2/3/3 among the temporal, height and width positions) with its image processor into `path` and returns
    the transformers reference."""
    torch.manual_seed(seed)
    rope = {"rope_type": "default", "rope_theta": 10_000.0, "mrope_section": [2, 3, 3]}
    config = Qwen2_5_VLConfig(
        text_config={**TINY_SETTINGS, "rope_parameters": rope},
        vision_config=TINY_QWEN_VL_VISION,
        image_token_id=QWEN_VL_IMAGE_TOKEN,
        vision_start_token_id=QWEN_VL_VISION_START,
        vision_end_token_id=QWEN_VL_VISION_END,
        video_token_id=92,
    )
    config._attn_implementation = "eager"
    reference = Qwen2_5_VLForConditionalGeneration(config).eval()
    randomized_constants(reference)
    reference.save_pretrained(path)
    Qwen2VLImageProcessorPil(
        size={"shortest_edge": QWEN_VL_MIN_PIXELS, "longest_edge": QWEN_VL_MAX_PIXELS},
        patch_size=QWEN_VL_PATCH,
        merge_size=QWEN_VL_MERGE,
    ).save_pretrained(path)
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


def renamed_tensor(name: str, renames: tuple[tuple[str, str], ...]) -> str:
    """`name` under the first of `renames` (old prefix, new prefix) that applies."""
    for old, new in renames:
        if name.startswith(old):
            return new + name.removeprefix(old)
    return name


def make_vision_runner(
    path: Path, encoder_cache_bytes: int = 1 << 20, compile_mode: CompileMode = CompileMode.OFF
) -> ModelRunner:
    """A warmed-up float32 CPU runner of the vision-language checkpoint at `path`, encoding its images; compiled as
    --torch-compile `compile_mode` compiles (with a decode mirror, as on a CPU shard)."""
    checkpoint = read_checkpoint_config(path)
    images = load_image_embedder(checkpoint, torch.float32, CPU, encoder_cache_bytes)
    kv_cache_memory = 4 << 20
    options = ExecutionOptions(kv_cache_memory=kv_cache_memory, compile_mode=compile_mode)
    mirror = kv_cache_memory // 2 if compile_mode is not CompileMode.OFF else 0
    model = load_tiny_model(path, backend=TorchAttentionBackend(decode_mirror_memory=mirror))
    runner = ModelRunner(model, checkpoint.eos_token_ids, torch.float32, CPU, options, Companions(images=images))
    return warmed(runner)


def generate_alone(
    runner: ModelRunner, request: NewRequest, chunk_size: int, driver_class: type[StepDriver] = StepDriver
) -> tuple[list[int], list[torch.Tensor]]:
    """The tokens of `request`, its prompt run in chunks of `chunk_size` by a `driver_class`, and the logits each of
    its draws read."""
    with recorded_logits(runner) as logits:
        driver = driver_class(runner, runner.cache.num_blocks if runner.cache else 0, chunk_size)
        done = driver.run([request])
    return done[request.id], logits


class WholeSpanDriver(StepDriver):
    """Schedules as the router does around images whose spans attend bidirectionally: a chunk that would end inside
    a span ends before it, or, starting inside or at the span, runs the rest of it."""

    def __init__(self, runner: ModelRunner, num_blocks: int, chunk_size: int, seed: int = 0) -> None:
        super().__init__(runner, num_blocks, chunk_size, seed)
        self.spans: dict[int, list[tuple[int, int]]] = {}

    def step(self, new_requests: list[NewRequest]) -> None:
        for request in new_requests:
            self.spans[request.id] = [(image.offset, image.end) for image in request.images]
        super().step(new_requests)

    def chunk_len(self, request_id: int, num_computed: int, remaining: int) -> int:
        stop = num_computed + min(self.chunk_size, remaining)
        for start, end in self.spans.get(request_id, ()):
            if start < stop < end:
                stop = end if num_computed >= start else start
        return stop - num_computed


def qwen2_5_vl_images(checkpoint: Path, parts: list[list[int] | bytes]) -> dict[str, torch.Tensor]:
    """What transformers' image processor makes of the prompt's images (nothing for a text-only prompt)."""
    files = [Image.open(io.BytesIO(part)).convert("RGB") for part in parts if isinstance(part, bytes)]
    if not files:
        return {}
    return dict(Qwen2VLImageProcessorPil.from_pretrained(checkpoint)(images=files, return_tensors="pt"))


def qwen2_5_vl_prompt(checkpoint: Path, parts: list[list[int] | bytes]) -> tuple[list[int], tuple[ImageInput, ...]]:
    """Text runs and images as Qwen2.5-VL's processor expands them (each image its start token, one pad token per
    merged patch of the processor's grid, its end token), and the images."""
    grids = iter(qwen2_5_vl_images(checkpoint, parts).get("image_grid_thw", torch.empty(0, 3)).tolist())
    tokens: list[int] = []
    images = []
    for part in parts:
        if isinstance(part, bytes):
            frames, height, width = next(grids)
            count = frames * height * width // QWEN_VL_MERGE**2
            tokens.append(QWEN_VL_VISION_START)
            images.append(image_input(part, len(tokens), count))
            tokens.extend([*[QWEN_VL_IMAGE_TOKEN] * count, QWEN_VL_VISION_END])
        else:
            tokens.extend(part)
    return tokens, tuple(images)


def gemma3_prompt(parts: list[list[int] | bytes]) -> tuple[list[int], tuple[ImageInput, ...]]:
    """Text runs and images as Gemma3Processor expands them (each image a blank line, its start token, its span of
    soft tokens, its end token, a blank line), and the images."""
    tokens: list[int] = []
    images = []
    for part in parts:
        if isinstance(part, bytes):
            tokens.extend([GEMMA3_BLANK_LINE, GEMMA3_BOI_TOKEN])
            images.append(image_input(part, len(tokens), GEMMA3_TOKENS_PER_IMAGE))
            tokens.extend([*[GEMMA3_IMAGE_TOKEN] * GEMMA3_TOKENS_PER_IMAGE, GEMMA3_EOI_TOKEN, GEMMA3_BLANK_LINE])
        else:
            tokens.extend(part)
    return tokens, tuple(images)


def gemma3_reference_generate(
    reference: PreTrainedModel, checkpoint: Path, parts: list[list[int] | bytes], new_tokens: int, bidirectional: bool
) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' greedy tokens and logits for the prompt, with the image spans marked in `token_type_ids` as
    Gemma3Processor marks them (bidirectional) or left unmarked (causal throughout)."""
    tokens, _ = gemma3_prompt(parts)
    processor = Gemma3ImageProcessorPil.from_pretrained(checkpoint)
    files = [Image.open(io.BytesIO(part)).convert("RGB") for part in parts if isinstance(part, bytes)]
    pixels = processor(images=files, do_pan_and_scan=False, return_tensors="pt")["pixel_values"]
    input_ids = torch.tensor([tokens])
    token_type_ids = (input_ids == GEMMA3_IMAGE_TOKEN).long() if bidirectional else None
    with torch.no_grad():
        output = reference.generate(
            input_ids=input_ids,
            pixel_values=pixels,
            token_type_ids=token_type_ids,
            max_new_tokens=new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return output.sequences[0, len(tokens) :].tolist(), [step[0] for step in output.logits]


def generate_after_cached_prefix(
    runner: ModelRunner, tokens: list[int], images: tuple[ImageInput, ...], max_new_tokens: int, cached_blocks: int = 2
) -> tuple[list[int], list[torch.Tensor], int]:
    """Runs the prompt whole as request 1, then request 2 with the same prompt resuming after request 1's first
    `cached_blocks` KV blocks, as the router's prefix cache hands them over: request 2's greedy tokens, the logits
    they were drawn from, and the positions it took from the cache."""
    block_size = runner.cache.block_size if runner.cache else 0
    cached = cached_blocks * block_size
    first = image_request(1, tokens, images, max_new_tokens)
    blocks = tuple(range(-(-(len(tokens) + max_new_tokens) // block_size)))
    runner.step(StepInput(new_requests=(first,), scheduled=(ScheduledRequest(1, len(tokens), blocks, 0),)))
    runner.step(StepInput(finished=(1,)))
    second = image_request(2, tokens, images, max_new_tokens, stop_token_ids=tuple(runner.eos_token_ids))
    table = (*blocks[:cached_blocks], *range(len(blocks), 2 * len(blocks) - cached_blocks))
    with recorded_logits(runner) as logits:
        output = runner.step(
            StepInput(new_requests=(second,), scheduled=(ScheduledRequest(2, len(tokens) - cached, table, cached),))
        )
        generated = [output.generations[0].token_id]
        while len(generated) < max_new_tokens and output.generations[0].finish_reason is None:
            position = len(tokens) + len(generated) - 1
            output = runner.step(StepInput(scheduled=(ScheduledRequest(2, 1, (), position),)))
            generated.append(output.generations[0].token_id)
    return generated, list(logits), cached
