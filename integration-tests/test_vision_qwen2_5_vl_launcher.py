"""Qwen2.5-VL with images through the real stack: a tiny random Qwen2_5_VLForConditionalGeneration served by the
launcher answers as `transformers`' `generate` does on its processor's inputs, each image taking as many tokens as
its own size gives (dynamic resolution) at multimodal rotary positions, whether the prompt runs in one step or in
chunks, and reuses the prefix cache and the encoder cache for the same image; an image whose span cannot fit one step
is refused before admission."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import torch
from PIL import Image
from tandem_harness import TandemServer, write_tiny_qwen2_5_vl
from transformers import AutoImageProcessor, AutoTokenizer, Qwen2_5_VLForConditionalGeneration
from vision_serving import chat, data_url, png, shard_metric, start_with_shard_metrics

PREAMBLE = "Look closely at the pictures below and describe their colours, shapes and mood in a few words. " * 2
QUESTION = "What is it?"
NEW_TOKENS = 8
# Merged 2x2 patches of 8 pixels: each image takes (height // 16) x (width // 16) tokens after resizing.
MERGED_PATCH = 16


def chat_body(*images: bytes) -> dict[str, object]:
    parts = [{"type": "image_url", "image_url": {"url": data_url(image)}} for image in images]
    content = [{"type": "text", "text": PREAMBLE}, *parts, {"type": "text", "text": QUESTION}]
    return {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
    }


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Qwen2_5_VLForConditionalGeneration]:
    directory = tmp_path_factory.mktemp("qwen2_5_vl") / "model"
    return directory, write_tiny_qwen2_5_vl(directory)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory, qwen_dir: tuple[Path, object]) -> Iterator[TandemServer]:
    server = start_with_shard_metrics(tmp_path_factory.mktemp("qwen-server"), qwen_dir[0])
    yield server
    assert server.stop() == 0, server.log_tail()


@pytest.fixture(scope="module")
def qwen_chunked(tmp_path_factory: pytest.TempPathFactory, qwen_dir: tuple[Path, object]) -> Iterator[TandemServer]:
    # Steps of 20 tokens: prompts run in chunks, and an image of more than 20 tokens can never run.
    server = start_with_shard_metrics(
        tmp_path_factory.mktemp("qwen-chunked"), qwen_dir[0], "--max-batch-prefill-tokens", "20"
    )
    yield server
    assert server.stop() == 0, server.log_tail()


def reference(
    directory: Path, model: Qwen2_5_VLForConditionalGeneration, *images: bytes
) -> tuple[str, list[int], list[int]]:
    """`transformers`' greedy continuation, its prompt's ids and each image's token count: the chat template
    rendered, each `<|image_pad|>` widened to the image processor's merged grid (as Qwen2_5_VLProcessor does) and
    the pixels and grids passed to `generate`."""
    tokenizer = AutoTokenizer.from_pretrained(directory)
    content = [
        {"type": "text", "text": PREAMBLE},
        *({"type": "image"} for _ in images),
        {"type": "text", "text": QUESTION},
    ]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    processed = AutoImageProcessor.from_pretrained(directory, backend="pil")(
        images=[Image.open(io.BytesIO(image)).convert("RGB") for image in images], return_tensors="pt"
    )
    counts = [int(grid.prod()) // 4 for grid in processed["image_grid_thw"]]
    pieces = text.split("<|image_pad|>")
    widened = pieces[0] + "".join(
        "<|image_pad|>" * count + piece for count, piece in zip(counts, pieces[1:], strict=True)
    )
    prompt = tokenizer(widened, add_special_tokens=False)["input_ids"]
    input_ids = torch.tensor([prompt])
    # The processor marks the image tokens, which place the multimodal rotary positions; the model keeps the last
    # prompt's position shift until told otherwise.
    model.model.rope_deltas = None
    with torch.no_grad():
        output = model.generate(
            input_ids=input_ids,
            mm_token_type_ids=(input_ids == model.config.image_token_id).int(),
            pixel_values=processed["pixel_values"],
            image_grid_thw=processed["image_grid_thw"],
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
        )
    answer = tokenizer.decode(output[0, len(prompt) :].tolist(), skip_special_tokens=True)
    return answer, prompt, counts


@pytest.mark.parametrize("server_name", ["qwen", "qwen_chunked"])
def test_greedy_answers_equal_transformers_for_images_of_different_sizes(
    request: pytest.FixtureRequest, server_name: str, qwen_dir: tuple[Path, Qwen2_5_VLForConditionalGeneration]
) -> None:
    server: TandemServer = request.getfixturevalue(server_name)
    answers = []
    for images in ((png("teal", (64, 48)),), (png("maroon", (40, 72)), png("olive", (48, 48)))):
        expected, prompt, counts = reference(*qwen_dir, *images)
        answer = chat(server, chat_body(*images))
        assert answer["usage"]["prompt_tokens"] == len(prompt)
        assert answer["choices"][0]["message"]["content"] == expected
        answers.append((expected, counts))
    # Each image's span is as long as its own size makes it.
    assert answers[0][1] == [12] and answers[1][1] == [8, 9], answers
    assert answers[0][0] != answers[1][0]


def test_the_same_image_reuses_its_kv_blocks_and_its_encoding(
    qwen: TandemServer, qwen_dir: tuple[Path, Qwen2_5_VLForConditionalGeneration]
) -> None:
    image = png("orange", (80, 64))
    expected, prompt, _ = reference(*qwen_dir, image)
    runs = shard_metric(qwen, "tandem_shard_image_encoder_runs_total")
    first = chat(qwen, chat_body(image))
    second = chat(qwen, chat_body(image))
    assert shard_metric(qwen, "tandem_shard_image_encoder_runs_total") == runs + 1
    assert first["choices"][0]["message"]["content"] == expected
    assert second["choices"][0]["message"]["content"] == expected
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == (len(prompt) - 1) // 16 * 16, second["usage"]


def test_an_image_too_long_for_a_step_is_refused_and_a_small_one_still_served(qwen_chunked: TandemServer) -> None:
    large = png("navy", (128, 128))
    refused = requests.post(f"{qwen_chunked.base_url}/v1/chat/completions", json=chat_body(large), timeout=60)
    assert refused.status_code == 400, refused.text
    message = refused.json()["error"]["message"]
    assert "64" in message and "--max-batch-prefill-tokens" in message, message
    assert chat(qwen_chunked, chat_body(png("navy", (32, 32))))["usage"]["completion_tokens"] == NEW_TOKENS
    assert qwen_chunked.metric("tandem_running_requests") == 0


def test_two_shards_answer_as_one(
    tmp_path_factory: pytest.TempPathFactory, qwen_dir: tuple[Path, object], qwen: TandemServer
) -> None:
    body = chat_body(png("maroon", (40, 72)), png("olive", (48, 48)))
    one = chat(qwen, body)["choices"][0]["message"]["content"]
    server = start_with_shard_metrics(tmp_path_factory.mktemp("qwen-tp2"), qwen_dir[0], "--num-shard", "2")
    try:
        assert chat(server, body)["choices"][0]["message"]["content"] == one
    finally:
        assert server.stop() == 0, server.log_tail()
