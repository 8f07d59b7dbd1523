"""Images in requests: the encoder cache, failures that end one request alone, text-only models, the contract."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from prometheus_client import generate_latest
from shard_testing import StepDriver, make_runner, new_request, warmed, write_tiny_llama
from tandem_server.distributed import ParallelContext
from tandem_server.engine.model_runner import ModelRunner
from tandem_server.engine.step import NewRequest
from tandem_server.errors import FailureKind
from tandem_server.metrics import ShardMetrics
from tandem_server.rpc.convert import step_input_from_pb
from tandem_server.rpc.generated import shard_pb2
from tandem_server.rpc.servicer import build_info
from tandem_server.vision.encoder_cache import EncoderCache
from vision_testing import (
    IMAGE_TOKEN,
    image_file,
    image_input,
    image_request,
    make_vision_runner,
    prompt_with_images,
    write_tiny_llava,
)

FIRST_IMAGE = image_file(11)
SECOND_IMAGE = image_file(12, (40, 120))


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("llava-requests")
    write_tiny_llava(path)
    return path


def healthy_requests() -> list[NewRequest]:
    tokens, images = prompt_with_images([[1, 7], SECOND_IMAGE, [30, 31]])
    return [image_request(10, tokens, images, 6), new_request(11, [9, 4, 40], 5)]


def run(runner: ModelRunner, requests: list[NewRequest]) -> StepDriver:
    driver = StepDriver(runner, runner.cache.num_blocks if runner.cache else 0, chunk_size=9)
    driver.run(requests)
    return driver


def test_the_same_image_twice_runs_the_encoder_once(llava: Path) -> None:
    runner = make_vision_runner(llava)
    tokens, images = prompt_with_images([[1, 5], FIRST_IMAGE, [33, 8]])
    first = run(runner, [image_request(1, tokens, images, 6)]).done[1]
    second = run(runner, [image_request(2, tokens, images, 6)]).done[2]
    assert runner.images is not None
    counts = runner.images.counts()
    assert first == second
    assert counts.runs == 1
    # Chunks of 9 reach the span at 2..17 in two steps per request.
    assert counts.cache_hits == 3
    assert counts.seconds > 0


def test_a_zero_byte_encoder_cache_encodes_every_chunk_again_with_the_same_result(llava: Path) -> None:
    tokens, images = prompt_with_images([[1, 5], FIRST_IMAGE, [33, 8]])
    cached = run(make_vision_runner(llava), [image_request(1, tokens, images, 6)]).done[1]
    runner = make_vision_runner(llava, encoder_cache_bytes=0)
    assert run(runner, [image_request(1, tokens, images, 6)]).done[1] == cached
    assert runner.images is not None and runner.images.counts().runs == 2


def test_the_encoder_cache_evicts_the_least_recently_used_to_stay_within_its_bytes() -> None:
    cache = EncoderCache(max_bytes=3 * 64)
    row = torch.zeros(16)  # 64 bytes
    for digest in (b"a", b"b", b"c"):
        cache.put(digest, row)
    assert cache.get(b"a") is not None
    cache.put(b"d", row)
    assert cache.get(b"b") is None
    assert [cache.get(digest) is not None for digest in (b"a", b"c", b"d")] == [True, True, True]
    cache.put(b"huge", torch.zeros(100))
    assert cache.get(b"huge") is None and cache.nbytes == 3 * 64 and len(cache) == 3


@pytest.mark.parametrize(
    ("hostile", "message"),
    [
        (image_request(1, [1, *[IMAGE_TOKEN] * 15, 9], (image_input(FIRST_IMAGE, 1, 15),)), "encodes to 16"),
        (
            image_request(1, [1, *[IMAGE_TOKEN] * 16, 9], (image_input(b"not an image", 1),)),
            "image 0: the image cannot be decoded",
        ),
        (
            image_request(1, [1, *[IMAGE_TOKEN] * 16, 9], (image_input(FIRST_IMAGE[:200], 1),)),
            "image 0: the image cannot be decoded",
        ),
        (image_request(1, [1, 5, *[IMAGE_TOKEN] * 15], (image_input(FIRST_IMAGE, 1),)), "holds tokens other"),
        (image_request(1, [1, *[IMAGE_TOKEN] * 16], (image_input(FIRST_IMAGE, 2),)), "leaves the 17-token prompt"),
        (
            image_request(1, [1, *[IMAGE_TOKEN] * 16], (dataclasses.replace(image_input(FIRST_IMAGE, 1), digest=b""),)),
            "not a SHA-256",
        ),
    ],
    ids=["wrong-count", "not-an-image", "truncated", "span-not-image-tokens", "span-outside-prompt", "no-digest"],
)
def test_an_image_that_cannot_run_fails_its_request_alone(llava: Path, hostile: NewRequest, message: str) -> None:
    expected = run(make_vision_runner(llava), healthy_requests()).done
    runner = make_vision_runner(llava)
    driver = run(runner, [*healthy_requests(), hostile])
    assert driver.done == expected
    assert driver.failed[1].kind is FailureKind.INVALID_PARAMETERS
    assert message in driver.failed[1].message
    assert len(runner.requests) == 0


def test_a_text_only_model_fails_a_request_with_images_alone(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path)
    healthy = [new_request(10, [5, 17, 33, 8], 6), new_request(11, [9, 4, 40], 5)]
    expected = run(warmed(make_runner(tmp_path)), healthy).done
    runner = warmed(make_runner(tmp_path))
    tokens, images = prompt_with_images([[1, 5], FIRST_IMAGE, [33, 8]])
    driver = run(runner, [*healthy, image_request(1, tokens, images)])
    assert driver.done == expected
    assert driver.failed[1].kind is FailureKind.INVALID_PARAMETERS
    assert driver.failed[1].message == "this model reads text only; the request carries 1 images"


def test_info_names_the_vision_encoder_and_a_text_model_none(llava: Path, tmp_path: Path) -> None:
    info = build_info(make_vision_runner(llava), "LlavaForConditionalGeneration", "torch", ParallelContext())
    assert info.vision_encoder == "CLIPVisionModel, 2 layers"
    write_tiny_llama(tmp_path)
    assert build_info(make_runner(tmp_path), "LlamaForCausalLM", "torch", ParallelContext()).vision_encoder == ""


def test_a_new_request_s_images_cross_the_contract() -> None:
    image = shard_pb2.ImageInput(data=b"png", digest=b"d" * 32, offset=3, num_tokens=16)
    step = step_input_from_pb(shard_pb2.StepRequest(new_requests=[shard_pb2.NewRequest(id=4, images=[image])]))
    (converted,) = step.new_requests[0].images
    assert (converted.data, converted.digest, converted.offset, converted.end) == (b"png", b"d" * 32, 3, 19)


def test_encoder_counts_render_as_counters_at_each_scrape(llava: Path) -> None:
    runner = make_vision_runner(llava)
    assert runner.images is not None
    metrics = ShardMetrics(rank=1, device=torch.device("cpu"))
    metrics.watch_image_encoder(runner.images.counts)
    tokens, images = prompt_with_images([[1, 5], FIRST_IMAGE, [33, 8]])
    run(runner, [image_request(1, tokens, images, 2)])
    text = generate_latest(metrics.registry).decode()
    assert 'tandem_shard_image_encoder_runs_total{rank="1"} 1.0' in text
    assert 'tandem_shard_image_encoder_cache_hits_total{rank="1"} 1.0' in text
    assert 'tandem_shard_image_encoder_seconds_total{rank="1"}' in text
