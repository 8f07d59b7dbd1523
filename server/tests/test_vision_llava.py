"""LLaVA served as its text decoder plus its CLIP tower and projector: the same tokens and logits as transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from shard_testing import StepDriver
from tandem_server.engine.step import ScheduledRequest, StepInput
from tandem_server.errors import ConfigError
from tandem_server.models.config import read_checkpoint_config
from tandem_server.vision.config import llava_args
from tandem_server.vision.loader import load_image_embedder
from vision_testing import (
    IMAGE_TOKEN,
    TOKENS_PER_IMAGE,
    generate_alone,
    image_file,
    image_request,
    make_vision_runner,
    prompt_with_images,
    reference_pixels,
    renamed_tensor,
    write_tiny_llava,
)

LOGITS_ATOL = 1e-4
NEW_TOKENS = 8

PROMPTS: dict[str, list[list[int] | bytes]] = {
    "one-image": [[1, 5, 17], image_file(1), [33, 8, 61]],
    "two-images": [[1, 12], image_file(2, (64, 100)), [40, 9], image_file(3, (56, 56), "JPEG"), [71, 12, 30]],
}


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("llava")
    return path, write_tiny_llava(path)


def reference_generate(reference: torch.nn.Module, checkpoint: Path, parts: list[list[int] | bytes]) -> tuple:
    tokens, _ = prompt_with_images(parts)
    pixels = reference_pixels(checkpoint, [part for part in parts if isinstance(part, bytes)])
    with torch.no_grad():
        output = reference.generate(
            input_ids=torch.tensor([tokens]),
            pixel_values=pixels,
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return output.sequences[0, len(tokens) :].tolist(), [step[0] for step in output.logits]


# Chunks of 7 put a chunk boundary inside every image span; 64 runs each prompt in one step.
@pytest.mark.parametrize("chunk_size", [7, 64])
@pytest.mark.parametrize("prompt", sorted(PROMPTS))
def test_greedy_tokens_and_logits_match_transformers(
    llava: tuple[Path, torch.nn.Module], prompt: str, chunk_size: int
) -> None:
    path, reference = llava
    parts = PROMPTS[prompt]
    tokens, images = prompt_with_images(parts)
    runner = make_vision_runner(path)
    eos = tuple(runner.eos_token_ids)
    ours, logits = generate_alone(runner, image_request(0, tokens, images, NEW_TOKENS, stop_token_ids=eos), chunk_size)
    expected_tokens, expected_logits = reference_generate(reference, path, parts)
    assert ours == expected_tokens
    for step, (got, want) in enumerate(zip(logits, expected_logits, strict=True)):
        assert (got[0] - want).abs().max().item() <= LOGITS_ATOL, f"{prompt}: logits of draw {step}"


def test_a_prefix_cache_hit_inside_an_image_span_runs_the_rest_of_it(llava: tuple[Path, torch.nn.Module]) -> None:
    path, reference = llava
    parts = PROMPTS["one-image"]
    tokens, images = prompt_with_images(parts)
    runner = make_vision_runner(path)
    block_size = runner.cache.block_size if runner.cache else 0
    # The first request's prompt fills blocks 0..5; a second one with the same prompt starts after its first two
    # blocks (8 positions, 5 of them inside the image span at 3..18), as the router's prefix cache would hand them.
    cached = 2 * block_size
    assert images[0].offset < cached < images[0].end
    first = image_request(1, tokens, images, NEW_TOKENS)
    blocks = tuple(range(-(-(len(tokens) + NEW_TOKENS) // block_size)))
    runner.step(StepInput(new_requests=(first,), scheduled=(ScheduledRequest(1, len(tokens), blocks, 0),)))
    runner.step(StepInput(finished=(1,)))
    second = image_request(2, tokens, images, NEW_TOKENS, stop_token_ids=tuple(runner.eos_token_ids))
    fresh = tuple(range(len(blocks), 2 * len(blocks) - 2))
    table = (*blocks[:2], *fresh)
    output = runner.step(
        StepInput(new_requests=(second,), scheduled=(ScheduledRequest(2, len(tokens) - cached, table, cached),))
    )
    generated = [output.generations[0].token_id]
    while len(generated) < NEW_TOKENS and output.generations[0].finish_reason is None:
        position = len(tokens) + len(generated) - 1
        output = runner.step(StepInput(scheduled=(ScheduledRequest(2, 1, (), position),)))
        generated.append(output.generations[0].token_id)
    assert generated == reference_generate(reference, path, parts)[0]


def test_a_prefix_cache_hit_past_every_image_encodes_nothing(llava: tuple[Path, torch.nn.Module]) -> None:
    path, _ = llava
    tokens, images = prompt_with_images([[1, 5], image_file(4), [33, 8, 61, 7, 7, 7, 7, 7]])
    runner = make_vision_runner(path)
    assert runner.images is not None
    # Positions 0..19 (the image at 2..17) are cached; only the text after them runs.
    request = image_request(1, tokens, images)
    runner.step(
        StepInput(new_requests=(request,), scheduled=(ScheduledRequest(1, len(tokens) - 20, tuple(range(8)), 20),))
    )
    counts = runner.images.counts()
    assert (counts.runs, counts.cache_hits) == (0, 0)


def test_chunked_and_whole_prompts_with_images_batch_together(llava: tuple[Path, torch.nn.Module]) -> None:
    path, reference = llava
    runner = make_vision_runner(path)
    eos = tuple(runner.eos_token_ids)
    requests = [
        image_request(i, *prompt_with_images(PROMPTS[name]), NEW_TOKENS, stop_token_ids=eos)
        for i, name in enumerate(sorted(PROMPTS))
    ]
    done = StepDriver(runner, runner.cache.num_blocks if runner.cache else 0, chunk_size=11).run(requests)
    for i, name in enumerate(sorted(PROMPTS)):
        assert done[i] == reference_generate(reference, path, PROMPTS[name])[0], name


@pytest.mark.parametrize(
    ("naming", "renames"),
    [
        (
            "transformers-5",
            (
                ("language_model.model.", "model.language_model."),
                ("language_model.lm_head.", "lm_head."),
                ("vision_tower.", "model.vision_tower."),
                ("multi_modal_projector.", "model.multi_modal_projector."),
            ),
        ),
        ("llava-hf", (("vision_tower.", "vision_tower.vision_model."),)),
    ],
)
def test_both_checkpoint_namings_load_the_same_model(
    llava: tuple[Path, torch.nn.Module], tmp_path: Path, naming: str, renames: tuple[tuple[str, str], ...]
) -> None:
    path, _ = llava
    renamed = {renamed_tensor(name, renames): tensor for name, tensor in load_file(path / "model.safetensors").items()}
    for file in path.iterdir():
        if file.suffix == ".json":
            (tmp_path / file.name).write_bytes(file.read_bytes())
    save_file(renamed, tmp_path / "model.safetensors", metadata={"format": "pt"})
    tokens, images = prompt_with_images(PROMPTS["two-images"])
    expected = generate_alone(make_vision_runner(path), image_request(0, tokens, images), 64)[0]
    assert generate_alone(make_vision_runner(tmp_path), image_request(0, tokens, images), 64)[0] == expected, naming


@pytest.mark.parametrize(("feature_layer", "strategy"), [(-1, "default"), ([0, -2, -1], "full"), (0, "full")])
def test_selected_hidden_states_match_transformers_image_features(
    tmp_path: Path, feature_layer: int | list[int], strategy: str
) -> None:
    reference = write_tiny_llava(tmp_path, vision_feature_layer=feature_layer, vision_feature_select_strategy=strategy)
    embedder = load_image_embedder(read_checkpoint_config(tmp_path), torch.float32, torch.device("cpu"), 0)
    assert embedder is not None
    data = image_file(5, (120, 80))
    ours = embedder.embeddings(data, b"\0" * 32)
    with torch.no_grad():
        features = reference.model.get_image_features(
            pixel_values=reference_pixels(tmp_path, [data]),
            vision_feature_layer=feature_layer,
            vision_feature_select_strategy=strategy,
            output_hidden_states=True,
        ).pooler_output[0]
    assert ours.shape == (TOKENS_PER_IMAGE + (strategy == "full"), 64)
    assert (ours - features).abs().max().item() <= 1e-5


def test_the_image_token_is_read_from_config(llava: tuple[Path, torch.nn.Module]) -> None:
    path, _ = llava
    runner = make_vision_runner(path)
    assert runner.images is not None and runner.images.image_token_id == IMAGE_TOKEN
    assert runner.images.description == "CLIPVisionModel, 2 layers"


# llava-hf/llava-1.5-7b-hf's config.json, which leaves most sizes to LlamaConfig's and CLIPVisionConfig's defaults.
LLAVA_1_5_CONFIG = {
    "architectures": ["LlavaForConditionalGeneration"],
    "image_token_index": 32000,
    "model_type": "llava",
    "projector_hidden_act": "gelu",
    "text_config": {
        "architectures": ["LlamaForCausalLM"],
        "max_position_embeddings": 4096,
        "model_type": "llama",
        "rms_norm_eps": 1e-05,
        "vocab_size": 32064,
    },
    "vision_config": {
        "hidden_size": 1024,
        "image_size": 336,
        "intermediate_size": 4096,
        "model_type": "clip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 24,
        "patch_size": 14,
        "projection_dim": 768,
    },
    "vision_feature_layer": -2,
    "vision_feature_select_strategy": "default",
}


def test_llava_1_5_s_published_config_reads_with_llama_and_clip_defaults(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAVA_1_5_CONFIG))
    checkpoint = read_checkpoint_config(tmp_path)
    assert checkpoint.family == "LlamaForCausalLM" and checkpoint.skipped_parts == ()
    sizes = {key: checkpoint.hf[key] for key in ("hidden_size", "num_hidden_layers", "vocab_size", "rms_norm_eps")}
    assert sizes == {"hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 32064, "rms_norm_eps": 1e-05}
    assert checkpoint.whole_hf is not None
    args = llava_args(checkpoint.whole_hf, checkpoint.hf["hidden_size"])
    assert (args.tokens_per_image, args.depth, args.image_token_id) == (576, 23, 32000)
    assert (args.vision.hidden_act, args.projector_act, args.feature_layers) == ("quick_gelu", "gelu", (23,))


def test_a_text_model_type_no_family_serves_is_a_clear_start_up_error(tmp_path: Path) -> None:
    config = {**LLAVA_1_5_CONFIG, "text_config": {"model_type": "gpt2"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="its text model type 'gpt2' is not served; supported: llama, mistral"):
        read_checkpoint_config(tmp_path)
