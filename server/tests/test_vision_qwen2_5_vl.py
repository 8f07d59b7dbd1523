"""Qwen2.5-VL served as its Qwen2 text decoder plus its windowed vision tower and patch merger, the text decoder's
rotary positions following each image's grid (M-RoPE): the same tokens and logits as transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from shard_testing import StepDriver, decode_graph
from tandem_server.config import CompileMode
from tandem_server.engine.grid_positions import GridPositions, ImageGrid, rotary_positions
from tandem_server.errors import FailureKind
from tandem_server.execution.batch import ScheduledSpan
from tandem_server.layers.rope_config import RopeConfig
from tandem_server.models.config import read_checkpoint_config
from tandem_server.vision.loader import VISION_FAMILIES
from tandem_server.vision.qwen2_5_vl import Qwen2_5_VLImageEncoder
from transformers import PreTrainedModel
from vision_testing import (
    QWEN_VL_IMAGE_TOKEN,
    generate_after_cached_prefix,
    generate_alone,
    image_file,
    image_input,
    image_request,
    make_vision_runner,
    qwen2_5_vl_images,
    qwen2_5_vl_prompt,
    renamed_tensor,
    write_tiny_qwen2_5_vl,
)

LOGITS_ATOL = 1e-4
NEW_TOKENS = 8

# Images of different sizes, so their spans hold different numbers of tokens (3x5 and 3x4 merged units).
PROMPTS: dict[str, list[list[int] | bytes]] = {
    "one-image": [[1, 5, 17], image_file(1, (40, 24)), [33, 8, 61]],
    "two-images": [[1, 12], image_file(2, (40, 24)), [40, 9], image_file(3, (90, 70), "JPEG"), [71, 12, 30]],
    "text-only": [[1, 5, 17, 33, 8, 61, 40, 9]],
}


@pytest.fixture(scope="module")
def qwen_vl(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PreTrainedModel]:
    path = tmp_path_factory.mktemp("qwen2_5_vl")
    return path, write_tiny_qwen2_5_vl(path)


def reference_generate(
    reference: PreTrainedModel, checkpoint: Path, parts: list[list[int] | bytes]
) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' greedy tokens and logits for the prompt, its image tokens marked as the processor marks them."""
    tokens, _ = qwen2_5_vl_prompt(checkpoint, parts)
    input_ids = torch.tensor([tokens])
    images = qwen2_5_vl_images(checkpoint, parts)
    if images:
        images["mm_token_type_ids"] = (input_ids == QWEN_VL_IMAGE_TOKEN).int()
    reference.model.rope_deltas = None
    with torch.no_grad():
        output = reference.generate(
            input_ids=input_ids,
            **images,
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return output.sequences[0, len(tokens) :].tolist(), [step[0] for step in output.logits]


def served(path: Path, prompt: str, chunk_size: int) -> tuple[list[int], list[torch.Tensor]]:
    runner = make_vision_runner(path)
    tokens, images = qwen2_5_vl_prompt(path, PROMPTS[prompt])
    request = image_request(0, tokens, images, NEW_TOKENS, stop_token_ids=tuple(runner.eos_token_ids))
    return generate_alone(runner, request, chunk_size, StepDriver)


# Chunks of 5 end inside spans and before them (causal attention lets them); 64 runs each prompt in one step.
@pytest.mark.parametrize("chunk_size", [5, 64])
@pytest.mark.parametrize("prompt", sorted(PROMPTS))
def test_greedy_tokens_and_logits_match_transformers(
    qwen_vl: tuple[Path, PreTrainedModel], prompt: str, chunk_size: int
) -> None:
    path, reference = qwen_vl
    ours, logits = served(path, prompt, chunk_size)
    expected_tokens, expected_logits = reference_generate(reference, path, PROMPTS[prompt])
    assert ours == expected_tokens
    for step, (got, want) in enumerate(zip(logits, expected_logits, strict=True)):
        assert (got[0] - want).abs().max().item() <= LOGITS_ATOL, f"{prompt}: logits of draw {step}"


def test_rotary_positions_of_any_chunk_are_transformers_rope_index(qwen_vl: tuple[Path, PreTrainedModel]) -> None:
    path, reference = qwen_vl
    tokens, images = qwen2_5_vl_prompt(path, PROMPTS["two-images"])
    input_ids = torch.tensor([tokens])
    grid_thw = qwen2_5_vl_images(path, PROMPTS["two-images"])["image_grid_thw"]
    expected, _ = reference.model.get_rope_index(
        input_ids, (input_ids == QWEN_VL_IMAGE_TOKEN).int(), image_grid_thw=grid_thw
    )
    grids = GridPositions(
        tuple(
            ImageGrid(image.offset, h // 2, w // 2) for image, (_, h, w) in zip(images, grid_thw.tolist(), strict=True)
        )
    )
    assert torch.equal(grids.chunk(0, len(tokens)), expected[:, 0])
    for start in range(len(tokens)):
        assert torch.equal(grids.chunk(start, 3), grids.chunk(0, len(tokens) + 3)[:, start : start + 3])
    # Generated tokens continue after the last text token's position.
    assert grids.chunk(len(tokens), 1)[:, 0].tolist() == [int(expected.max()) + 1] * 3


def test_a_step_past_every_image_rotates_by_one_position_per_row_so_graphs_replay_it() -> None:
    grids = {1: GridPositions((ImageGrid(2, 3, 5),))}
    # Request 1 decodes after its 3x5 image (15 tokens from position 2, 10 positions behind); request 2 is text.
    decodes = [ScheduledSpan([7], 30, [0], 1), ScheduledSpan([8], 12, [1], 2)]
    assert rotary_positions(decodes, grids, torch.device("cpu")).tolist() == [20, 12]
    # The image's last token (row 2, column 4 from position 2), then text from 2 + max(3, 5).
    prefill = [ScheduledSpan([7, 7, 7], 16, [0], 1)]
    assert rotary_positions(prefill, grids, torch.device("cpu")).tolist() == [[2, 7, 8], [4, 7, 8], [6, 7, 8]]


# The slow tier (compiles graphs with Inductor).
@pytest.mark.slow
def test_decodes_after_images_run_through_the_compiled_decode_graphs(qwen_vl: tuple[Path, PreTrainedModel]) -> None:
    path, reference = qwen_vl
    runner = make_vision_runner(path, compile_mode=CompileMode.WARMUP)
    graph = decode_graph(runner)
    assert graph is not None
    warmup_steps = graph.steps
    tokens, images = qwen2_5_vl_prompt(path, PROMPTS["two-images"])
    request = image_request(0, tokens, images, NEW_TOKENS, stop_token_ids=tuple(runner.eos_token_ids))
    ours, logits = generate_alone(runner, request, 64, StepDriver)
    expected_tokens, expected_logits = reference_generate(reference, path, PROMPTS["two-images"])
    assert ours == expected_tokens
    assert graph.steps - warmup_steps == len(ours) - 1
    for step, (got, want) in enumerate(zip(logits, expected_logits, strict=True)):
        assert (got[0] - want).abs().max().item() <= LOGITS_ATOL, f"logits of draw {step}"


def test_a_prefix_cache_hit_inside_an_image_span_runs_the_rest_of_it(qwen_vl: tuple[Path, PreTrainedModel]) -> None:
    path, reference = qwen_vl
    tokens, images = qwen2_5_vl_prompt(path, PROMPTS["two-images"])
    generated, logits, cached = generate_after_cached_prefix(make_vision_runner(path), tokens, images, NEW_TOKENS)
    assert images[0].offset < cached < images[0].end
    expected_tokens, expected_logits = reference_generate(reference, path, PROMPTS["two-images"])
    assert generated == expected_tokens
    for step, (got, want) in enumerate(zip(logits, expected_logits, strict=True)):
        assert (got[0] - want).abs().max().item() <= LOGITS_ATOL, f"logits of draw {step}"


def test_a_request_recomputed_after_preemption_continues_with_the_same_tokens(
    qwen_vl: tuple[Path, PreTrainedModel],
) -> None:
    path, reference = qwen_vl
    tokens, images = qwen2_5_vl_prompt(path, PROMPTS["two-images"])
    expected, _ = reference_generate(reference, path, PROMPTS["two-images"])
    runner = make_vision_runner(path)
    # Re-admitted with its first three generated tokens, as the router sends a preempted request back.
    resumed = image_request(
        1, [*tokens, *expected[:3]], images, NEW_TOKENS, num_output_tokens=3, stop_token_ids=tuple(runner.eos_token_ids)
    )
    done = StepDriver(runner, runner.cache.num_blocks if runner.cache else 0, chunk_size=7).run([resumed])
    assert done[1] == expected[3:]


def test_a_span_of_another_size_than_the_image_s_grid_fails_that_request_alone(
    qwen_vl: tuple[Path, PreTrainedModel],
) -> None:
    path, _ = qwen_vl
    runner = make_vision_runner(path)
    tokens, images = qwen2_5_vl_prompt(path, PROMPTS["one-image"])
    # The 40x24 image is a 3x5 grid; the span is widened by one token.
    image = images[0]
    widened = [*tokens[: image.end], QWEN_VL_IMAGE_TOKEN, *tokens[image.end :]]
    wrong = (image_input(image.data, image.offset, image.num_tokens + 1),)
    driver = StepDriver(runner, runner.cache.num_blocks if runner.cache else 0, chunk_size=64)
    driver.run([image_request(1, widened, wrong), image_request(2, [1, 5, 17, 33], ())])
    assert set(driver.done) == {2}
    failure = driver.failed[1]
    assert failure.kind is FailureKind.INVALID_PARAMETERS
    assert "image 0 becomes 3x5 tokens, its span holds 16 positions" in failure.message


def test_the_family_is_registered_and_reads_multimodal_rotary(qwen_vl: tuple[Path, PreTrainedModel]) -> None:
    path, _ = qwen_vl
    assert VISION_FAMILIES["Qwen2_5_VLForConditionalGeneration"] is Qwen2_5_VLImageEncoder
    checkpoint = read_checkpoint_config(path)
    assert checkpoint.family == "Qwen2ForCausalLM" and checkpoint.skipped_parts == ()
    assert RopeConfig.from_hf(checkpoint.hf).mrope_section == (2, 3, 3)
    runner = make_vision_runner(path)
    assert runner.images is not None and runner.images.image_token_id == QWEN_VL_IMAGE_TOKEN
    assert runner.images.grid_positions and runner.images.token_grid(image_file(1, (90, 70))) == (3, 4)


def test_the_published_layout_and_transformers_5_s_load_the_same_model(
    qwen_vl: tuple[Path, PreTrainedModel], tmp_path: Path
) -> None:
    """The published checkpoints keep the text settings at the top of config.json; a model's own state dict names
    the text decoder `model.language_model.` and the tower `model.visual.`."""
    path, _ = qwen_vl
    tensors = load_file(path / "model.safetensors")
    renames = (("model.", "model.language_model."), ("visual.", "model.visual."))
    save_file({renamed_tensor(name, renames): t for name, t in tensors.items()}, tmp_path / "model.safetensors")
    for file in path.iterdir():
        if file.suffix == ".json":
            (tmp_path / file.name).write_bytes(file.read_bytes())
    config = json.loads((path / "config.json").read_text())
    text = config.pop("text_config")
    text["rope_scaling"] = {"type": "mrope", "mrope_section": text.pop("rope_parameters")["mrope_section"]}
    (tmp_path / "config.json").write_text(json.dumps({**text, **config, "model_type": "qwen2_5_vl"}))
    tokens, images = qwen2_5_vl_prompt(path, PROMPTS["two-images"])
    expected = generate_alone(make_vision_runner(path), image_request(0, tokens, images), 64)[0]
    assert generate_alone(make_vision_runner(tmp_path), image_request(0, tokens, images), 64)[0] == expected
