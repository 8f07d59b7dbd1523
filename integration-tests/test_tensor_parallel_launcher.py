"""`--num-shard 2` on the embedded SmolLM2 (9 heads in 3 KV groups, split 2 + 1) serves what one shard serves.

The two-shard server also drafts (`--speculate 4`): drafts never change a greedy token, so every test here holds with
them, and both ranks verify drafts in one forward pass."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import requests
from reference import Reference
from speculation import ACCEPTED, GROUNDED
from tandem_harness import FLOAT32_EAGER, MAX_INPUT_TOKENS, MAX_TOTAL_TOKENS, TandemServer, model_cache_dir

MAX_NEW_TOKENS = 16
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n",
    "<|im_start|>user\nName three primary colors.<|im_end|>\n<|im_start|>assistant\n",
    "1, 2, 3, 5, 8, 13,",
)


@pytest.fixture(scope="module")
def two_shards(tmp_path_factory: pytest.TempPathFactory, tandem: TandemServer) -> Iterator[TandemServer]:
    """A second server whose two shards split the model and verify drafts; started after the session server converted
    it."""
    log_path = tmp_path_factory.mktemp("two-shards") / "launcher.log"
    server = TandemServer.start(
        log_path,
        "--model-cache-dir", str(model_cache_dir()), *FLOAT32_EAGER,
        "--num-shard", "2",
        "--kv-cache-memory", "128MiB",
        "--max-input-tokens", str(MAX_INPUT_TOKENS),
        "--max-total-tokens", str(MAX_TOTAL_TOKENS),
        "--speculate", "4",
    )  # fmt: skip
    yield server
    status = server.stop()
    assert status == 0, f"tandem-launcher exited with {status} after SIGTERM:\n{server.log_tail()}"


def test_two_shards_report_their_world_size(two_shards: TandemServer) -> None:
    assert two_shards.info()["num_shard"] == 2


def test_two_shards_keep_drafts_and_give_the_greedy_tokens_of_transformers(
    two_shards: TandemServer, reference: Reference
) -> None:
    assert two_shards.info()["speculate"] == 4
    prompt = GROUNDED[0]
    before = two_shards.metric(ACCEPTED)
    expected = reference.greedy(prompt, MAX_NEW_TOKENS)
    reference.assert_same_greedy(prompt, expected, two_shards.generate_ids(prompt, MAX_NEW_TOKENS))
    assert two_shards.metric(ACCEPTED) > before


def test_two_shards_give_the_greedy_tokens_of_one_shard(
    tandem: TandemServer, two_shards: TandemServer, reference: Reference
) -> None:
    for prompt in PROMPTS:
        expected = tandem.generate_ids(prompt, MAX_NEW_TOKENS)
        actual = two_shards.generate_ids(prompt, MAX_NEW_TOKENS)
        assert len(actual) == len(expected) > 0, f"{prompt!r}: {actual} vs {expected}"
        # Row-parallel sums round differently from one matmul, so only a genuine near-tie may flip a token.
        reference.assert_same_greedy(prompt, expected, actual)


def test_two_shards_stream_the_tokens_they_generate(two_shards: TandemServer) -> None:
    prompt = PROMPTS[0]
    assert two_shards.stream_ids(prompt, MAX_NEW_TOKENS) == two_shards.generate_ids(prompt, MAX_NEW_TOKENS)


def test_deep_health_probes_during_a_stream_never_disturb_it(two_shards: TandemServer) -> None:
    """`/health?deep=true` runs a forward on both ranks between two steps: every probe answers 200 while a stream runs,
    and the stream's tokens are those it gives alone."""
    prompt = PROMPTS[0]
    alone = two_shards.generate_ids(prompt, 32)
    streamed: list[list[int]] = []
    worker = threading.Thread(target=lambda: streamed.append(two_shards.stream_ids(prompt, 32)))
    worker.start()
    statuses = []
    while worker.is_alive() or not statuses:
        statuses.append(requests.get(f"{two_shards.base_url}/health?deep=true", timeout=60).status_code)
    worker.join()
    assert set(statuses) == {200}, statuses
    assert streamed == [alone]
