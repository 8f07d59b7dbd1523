"""Gemma 3 served as its text decoder plus its SigLIP tower and pooling projector, each image's span attending to
itself bidirectionally: the same tokens and logits as transformers."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from shard_testing import StepDriver
from tandem_server.bootstrap import choose_attention_backend
from tandem_server.config import ShardConfig
from tandem_server.errors import ConfigError, FailureKind
from tandem_server.models.config import read_checkpoint_config
from tandem_server.vision.config import gemma3_vision_args
from tandem_server.vision.gemma3 import Gemma3ImageEncoder
from tandem_server.vision.loader import VISION_FAMILIES, attends_bidirectionally_within_images, load_image_embedder
from transformers import Gemma3ImageProcessorPil, PreTrainedModel
from vision_testing import (
    GEMMA3_IMAGE_TOKEN,
    GEMMA3_TOKENS_PER_IMAGE,
    WholeSpanDriver,
    gemma3_prompt,
    gemma3_reference_generate,
    generate_after_cached_prefix,
    generate_alone,
    image_file,
    image_request,
    make_vision_runner,
    renamed_tensor,
    write_tiny_gemma3_vision,
)

LOGITS_ATOL = 1e-4
NEW_TOKENS = 8

PROMPTS: dict[str, list[list[int] | bytes]] = {
    "one-image": [[1, 5, 17], image_file(1), [33, 8, 61]],
    "two-images": [[1, 12], image_file(2, (64, 100)), [40, 9], image_file(3, (56, 56), "JPEG"), [71, 12, 30]],
}


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PreTrainedModel]:
    path = tmp_path_factory.mktemp("gemma3")
    return path, write_tiny_gemma3_vision(path)


def served(path: Path, prompt: str, chunk_size: int, driver: type[StepDriver]) -> tuple[list[int], list[torch.Tensor]]:
    runner = make_vision_runner(path)
    tokens, images = gemma3_prompt(PROMPTS[prompt])
    request = image_request(0, tokens, images, NEW_TOKENS, stop_token_ids=tuple(runner.eos_token_ids))
    return generate_alone(runner, request, chunk_size, driver)


# Chunks of 6 end before each span and run it whole; 64 runs each prompt in one step.
@pytest.mark.parametrize("chunk_size", [6, 64])
@pytest.mark.parametrize("prompt", sorted(PROMPTS))
def test_greedy_tokens_and_logits_match_transformers(
    gemma3: tuple[Path, PreTrainedModel], prompt: str, chunk_size: int
) -> None:
    path, reference = gemma3
    ours, logits = served(path, prompt, chunk_size, WholeSpanDriver)
    expected_tokens, expected_logits = gemma3_reference_generate(
        reference, path, PROMPTS[prompt], NEW_TOKENS, bidirectional=True
    )
    assert ours == expected_tokens
    for step, (got, want) in enumerate(zip(logits, expected_logits, strict=True)):
        assert (got[0] - want).abs().max().item() <= LOGITS_ATOL, f"{prompt}: logits of draw {step}"


def test_causal_attention_over_the_image_spans_would_compute_other_logits(
    gemma3: tuple[Path, PreTrainedModel],
) -> None:
    path, reference = gemma3
    _, ours = served(path, "two-images", 64, StepDriver)
    _, causal = gemma3_reference_generate(reference, path, PROMPTS["two-images"], NEW_TOKENS, bidirectional=False)
    assert (ours[0][0] - causal[0]).abs().max().item() > 100 * LOGITS_ATOL


def test_a_prefix_cache_hit_inside_an_image_span_runs_the_rest_of_it(gemma3: tuple[Path, PreTrainedModel]) -> None:
    path, reference = gemma3
    tokens, images = gemma3_prompt(PROMPTS["one-image"])
    # The second request starts after the first one's first two blocks (8 positions, 3 of them inside the image span
    # at 5..20), as the router's prefix cache would hand them.
    generated, logits, cached = generate_after_cached_prefix(make_vision_runner(path), tokens, images, NEW_TOKENS)
    assert images[0].offset < cached < images[0].end
    expected_tokens, expected_logits = gemma3_reference_generate(
        reference, path, PROMPTS["one-image"], NEW_TOKENS, bidirectional=True
    )
    assert generated == expected_tokens
    assert (logits[0][0] - expected_logits[0]).abs().max().item() <= LOGITS_ATOL


def test_a_chunk_ending_inside_an_image_span_fails_that_request_alone(gemma3: tuple[Path, PreTrainedModel]) -> None:
    path, _ = gemma3
    runner = make_vision_runner(path)
    tokens, images = gemma3_prompt(PROMPTS["one-image"])
    # Chunks of 7 end at position 7, inside the span at 5..20.
    driver = StepDriver(runner, runner.cache.num_blocks if runner.cache else 0, chunk_size=7)
    driver.run([image_request(1, tokens, images), image_request(2, [1, 5, 17, 33], ())])
    assert set(driver.done) == {2}
    failure = driver.failed[1]
    assert failure.kind is FailureKind.INVALID_PARAMETERS
    assert "ends at position 7, inside the image's span [5, 21)" in failure.message


def test_chunked_and_whole_prompts_with_images_batch_together(gemma3: tuple[Path, PreTrainedModel]) -> None:
    path, reference = gemma3
    runner = make_vision_runner(path)
    eos = tuple(runner.eos_token_ids)
    requests = [
        image_request(i, *gemma3_prompt(PROMPTS[name]), NEW_TOKENS, stop_token_ids=eos)
        for i, name in enumerate(sorted(PROMPTS))
    ]
    done = WholeSpanDriver(runner, runner.cache.num_blocks if runner.cache else 0, chunk_size=11).run(requests)
    for i, name in enumerate(sorted(PROMPTS)):
        expected = gemma3_reference_generate(reference, path, PROMPTS[name], NEW_TOKENS, bidirectional=True)
        assert done[i] == expected[0], name


def test_image_rows_take_the_projected_embeddings_unscaled_and_text_rows_scaled_ones(
    gemma3: tuple[Path, PreTrainedModel],
) -> None:
    path, _ = gemma3
    runner = make_vision_runner(path)
    assert runner.images is not None
    tokens, images = gemma3_prompt(PROMPTS["one-image"])
    inputs: list[torch.Tensor] = []
    first_layer = runner.model.model.layers[0]  # type: ignore[union-attr]
    handle = first_layer.register_forward_pre_hook(lambda _module, args: inputs.append(args[0].clone()))
    try:
        StepDriver(runner, runner.cache.num_blocks if runner.cache else 0, 64).step([image_request(1, tokens, images)])
    finally:
        handle.remove()
    image = images[0]
    projected = runner.images.embeddings(image.data, image.digest)
    assert torch.equal(inputs[0][image.offset : image.end], projected)
    text_rows = [row for row, token in enumerate(tokens) if token != GEMMA3_IMAGE_TOKEN]
    embed = runner.model.model.embed_tokens.weight  # type: ignore[union-attr]
    hidden_size = embed.shape[1]
    expected = embed[torch.tensor([tokens[row] for row in text_rows])] * torch.tensor(hidden_size**0.5)
    torch.testing.assert_close(inputs[0][text_rows], expected)


def test_image_features_match_transformers_and_pan_and_scan_is_not_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reference = write_tiny_gemma3_vision(tmp_path, do_pan_and_scan=True)
    with caplog.at_level(logging.INFO):
        embedder = load_image_embedder(read_checkpoint_config(tmp_path), torch.float32, torch.device("cpu"), 0)
    assert embedder is not None
    assert "images are preprocessed with do_pan_and_scan=False, not True as configured" in caplog.text
    # Wide enough that pan-and-scan would add crops.
    data = image_file(5, (200, 60))
    ours = embedder.embeddings(data, b"\0" * 32)
    image = Image.open(io.BytesIO(data)).convert("RGB")
    processor = Gemma3ImageProcessorPil.from_pretrained(tmp_path)
    pixels = processor(images=image, do_pan_and_scan=False, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        features = reference.model.get_image_features(pixel_values=pixels).pooler_output[0]
    assert ours.shape == (GEMMA3_TOKENS_PER_IMAGE, 64)
    assert (ours - features).abs().max().item() <= 1e-5


def test_the_family_is_registered_and_asks_for_bidirectional_image_spans(
    gemma3: tuple[Path, PreTrainedModel],
) -> None:
    path, _ = gemma3
    assert VISION_FAMILIES["Gemma3ForConditionalGeneration"] is Gemma3ImageEncoder
    assert attends_bidirectionally_within_images("Gemma3ForConditionalGeneration")
    assert not attends_bidirectionally_within_images("LlavaForConditionalGeneration")
    checkpoint = read_checkpoint_config(path)
    assert checkpoint.family == "Gemma3ForCausalLM" and checkpoint.skipped_parts == ()
    runner = make_vision_runner(path)
    assert runner.images is not None and runner.images.image_token_id == GEMMA3_IMAGE_TOKEN
    assert runner.images.description == "SiglipVisionModel, 2 layers"


def test_a_backend_that_cannot_open_image_spans_stops_start_up(gemma3: tuple[Path, PreTrainedModel]) -> None:
    path, _ = gemma3
    checkpoint = read_checkpoint_config(path)
    config = ShardConfig(model_path=path, uds_path=path / "shard.sock", attention_backend="sdpa")
    with pytest.raises(ConfigError, match="--attention-backend sdpa is unavailable: torch SDPA cannot let an image's"):
        choose_attention_backend(config, checkpoint, decode_mirror_memory=0)
    auto = ShardConfig(model_path=path, uds_path=path / "shard.sock")
    assert choose_attention_backend(auto, checkpoint, decode_mirror_memory=0).name == "torch"


# transformers (5.24) saves the tower's tensors straight under `vision_tower.`; google/gemma-3-*-it ship them under
# `vision_tower.vision_model.`; a model's own state dict names every part under `model.`.
@pytest.mark.parametrize(
    ("naming", "renames"),
    [
        ("published", (("vision_tower.", "vision_tower.vision_model."),)),
        (
            "state-dict",
            (
                ("language_model.model.", "model.language_model."),
                ("vision_tower.", "model.vision_tower.vision_model."),
                ("multi_modal_projector.", "model.multi_modal_projector."),
            ),
        ),
    ],
)
def test_every_checkpoint_naming_loads_the_same_model(
    gemma3: tuple[Path, PreTrainedModel], tmp_path: Path, naming: str, renames: tuple[tuple[str, str], ...]
) -> None:
    path, _ = gemma3
    tensors = load_file(path / "model.safetensors")
    assert any(name.startswith("vision_tower.embeddings.") for name in tensors)
    renamed = {renamed_tensor(name, renames): tensor for name, tensor in tensors.items()}
    for file in path.iterdir():
        if file.suffix == ".json":
            (tmp_path / file.name).write_bytes(file.read_bytes())
    save_file(renamed, tmp_path / "model.safetensors", metadata={"format": "pt"})
    tokens, images = gemma3_prompt(PROMPTS["two-images"])
    expected = generate_alone(make_vision_runner(path), image_request(0, tokens, images), 64)[0]
    assert generate_alone(make_vision_runner(tmp_path), image_request(0, tokens, images), 64)[0] == expected, naming


# google/gemma-3-4b-it's config.json, whose vision settings leave the rest to SiglipVisionConfig's and Gemma3Config's
# defaults.
GEMMA3_4B_CONFIG = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False},
}  # fmt: skip


def test_gemma_3_4b_s_published_config_reads_with_siglip_and_gemma3_defaults(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(GEMMA3_4B_CONFIG))
    checkpoint = read_checkpoint_config(tmp_path)
    assert checkpoint.whole_hf is not None and checkpoint.skipped_parts == ()
    args = gemma3_vision_args(checkpoint.whole_hf)
    assert (args.tokens_per_image, args.patches_per_side, args.pool_size, args.image_token_id) == (256, 64, 4, 262144)
    vision = args.vision
    assert (vision.hidden_act, vision.layer_norm_eps, vision.num_channels) == ("gelu_pytorch_tanh", 1e-6, 3)


def test_image_tokens_that_do_not_pool_the_patch_grid_evenly_are_a_start_up_error() -> None:
    config = {**GEMMA3_4B_CONFIG, "mm_tokens_per_image": 100}
    with pytest.raises(ConfigError, match="mm_tokens_per_image 100 does not pool the 64x64 patch grid"):
        gemma3_vision_args(config)
