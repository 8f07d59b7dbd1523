"""Gemma 3 with images through the real stack: a tiny random Gemma3ForConditionalGeneration served by the launcher
answers as `transformers`' processor and `generate` do (bidirectional attention within each image, its SigLIP tower
and pooled projector), whether its prompt runs in one step or in chunks cut around the image spans, and reuses the
prefix cache and the encoder cache for the same image."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import torch
from PIL import Image
from tandem_harness import TandemServer, write_tiny_gemma3_vision
from transformers import AutoProcessor, Gemma3ForConditionalGeneration
from vision_serving import chat, data_url, png, shard_metric, start_with_shard_metrics

# Long enough that the text before the first image fills whole KV blocks of 16 tokens.
PREAMBLE = "Look closely at the pictures below and describe their colours, shapes and mood in a few words. " * 2
# With this text the image's span is prompt positions [40, 56): a KV block boundary (48) falls inside it.
SPAN_ACROSS_A_BLOCK = (
    "Look closely at the pictures below and describe their colours, shapes and mood in a few words. "
    "Then say what the light and background are like. "
)
NEW_TOKENS = 8
QUESTION = "What is it?"


def chat_body(*images: bytes, question: str = QUESTION, preamble: str = PREAMBLE) -> dict[str, object]:
    parts = [{"type": "image_url", "image_url": {"url": data_url(image)}} for image in images]
    content = [{"type": "text", "text": preamble}, *parts, {"type": "text", "text": question}]
    return {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
    }


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Gemma3ForConditionalGeneration]:
    directory = tmp_path_factory.mktemp("gemma3") / "model"
    return directory, write_tiny_gemma3_vision(directory)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory, gemma3_dir: tuple[Path, object]) -> Iterator[TandemServer]:
    server = start_with_shard_metrics(tmp_path_factory.mktemp("gemma3-server"), gemma3_dir[0])
    yield server
    assert server.stop() == 0, server.log_tail()


@pytest.fixture(scope="module")
def gemma3_chunked(tmp_path_factory: pytest.TempPathFactory, gemma3_dir: tuple[Path, object]) -> Iterator[TandemServer]:
    # Steps of 20 tokens: most chunk ends would fall inside a span, so the scheduler cuts them at its start.
    server = start_with_shard_metrics(
        tmp_path_factory.mktemp("gemma3-chunked"), gemma3_dir[0], "--max-batch-prefill-tokens", "20"
    )
    yield server
    assert server.stop() == 0, server.log_tail()


def reference(
    directory: Path,
    model: Gemma3ForConditionalGeneration,
    *images: bytes,
    question: str = QUESTION,
    preamble: str = PREAMBLE,
) -> tuple[str, list[int]]:
    """`transformers`' greedy continuation and its prompt's ids: its processor renders the same chat, expands each
    image and marks the image tokens for bidirectional attention."""
    processor = AutoProcessor.from_pretrained(directory)
    content = [
        {"type": "text", "text": preamble},
        *({"type": "image", "image": Image.open(io.BytesIO(image)).convert("RGB")} for image in images),
        {"type": "text", "text": question},
    ]
    inputs = processor.apply_chat_template(
        [{"role": "user", "content": content}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    prompt = inputs["input_ids"][0].tolist()
    return processor.tokenizer.decode(output[0, len(prompt) :].tolist(), skip_special_tokens=True), prompt


@pytest.mark.parametrize("server_name", ["gemma3", "gemma3_chunked"])
def test_greedy_answers_equal_transformers_with_one_and_two_images(
    request: pytest.FixtureRequest, server_name: str, gemma3_dir: tuple[Path, Gemma3ForConditionalGeneration]
) -> None:
    server: TandemServer = request.getfixturevalue(server_name)
    answers = []
    for images in ((png("teal"),), (png("maroon", (40, 90)), png("olive"))):
        answer = chat(server, chat_body(*images))
        expected, prompt = reference(*gemma3_dir, *images)
        assert answer["usage"] == {**answer["usage"], "prompt_tokens": len(prompt), "completion_tokens": NEW_TOKENS}
        assert answer["choices"][0]["message"]["content"] == expected
        answers.append(expected)
    assert answers[0] != answers[1]


def test_the_same_image_resumes_inside_its_span_from_the_prefix_cache_without_encoding_again(
    gemma3: TandemServer, gemma3_dir: tuple[Path, Gemma3ForConditionalGeneration]
) -> None:
    # Two questions about one image share the blocks before the questions: the second request resumes at the block
    # boundary inside the image's span and computes the span's rest attending to the whole image.
    image = png("orange")
    runs = shard_metric(gemma3, "tandem_shard_image_encoder_runs_total")
    for question in (QUESTION, "Name its colour."):
        expected, prompt = reference(*gemma3_dir, image, question=question, preamble=SPAN_ACROSS_A_BLOCK)
        answer = chat(gemma3, chat_body(image, question=question, preamble=SPAN_ACROSS_A_BLOCK))
        assert answer["choices"][0]["message"]["content"] == expected
    span = [index for index, token in enumerate(prompt) if token == gemma3_dir[1].config.image_token_index]
    assert span[0] < 48 <= span[-1], (span[0], span[-1])
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 48, answer["usage"]
    assert shard_metric(gemma3, "tandem_shard_image_encoder_runs_total") == runs + 1


def test_two_shards_answer_as_one(
    tmp_path_factory: pytest.TempPathFactory, gemma3_dir: tuple[Path, object], gemma3: TandemServer
) -> None:
    body = chat_body(png("maroon"))
    one = chat(gemma3, body)["choices"][0]["message"]["content"]
    server = start_with_shard_metrics(tmp_path_factory.mktemp("gemma3-tp2"), gemma3_dir[0], "--num-shard", "2")
    try:
        assert chat(server, body)["choices"][0]["message"]["content"] == one
    finally:
        assert server.stop() == 0, server.log_tail()


def test_an_image_longer_than_a_step_is_refused_and_text_still_served(
    tmp_path_factory: pytest.TempPathFactory, gemma3_dir: tuple[Path, object]
) -> None:
    # Each image takes 16 positions that must run in one step; steps of 12 tokens can never hold them.
    server = start_with_shard_metrics(
        tmp_path_factory.mktemp("gemma3-short-steps"), gemma3_dir[0], "--max-batch-prefill-tokens", "12"
    )
    try:
        refused = requests.post(f"{server.base_url}/v1/chat/completions", json=chat_body(png("teal")), timeout=60)
        assert refused.status_code == 400, refused.text
        assert "--max-batch-prefill-tokens" in refused.json()["error"]["message"], refused.text
        text_only = {"messages": [{"role": "user", "content": PREAMBLE}], "max_tokens": 4, "ignore_eos": True}
        assert chat(server, text_only)["usage"]["completion_tokens"] == 4
        assert server.metric("tandem_running_requests") == 0
    finally:
        assert server.stop() == 0, server.log_tail()
