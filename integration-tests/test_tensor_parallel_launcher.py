"""`--num-shard 2` on the embedded SmolLM2 (9 heads in 3 KV groups, split 2 + 1) serves what one shard serves, and
so it does on a small mixture-of-experts model.

The two-shard server also drafts (`--speculate 4`): drafts never change a greedy token, so every test here holds with
them, and both ranks verify drafts in one forward pass."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import torch
from reference import Reference
from speculation import ACCEPTED, GROUNDED
from tandem_harness import (
    FLOAT32_EAGER,
    MAX_INPUT_TOKENS,
    MAX_TOTAL_TOKENS,
    TandemServer,
    embedded_model_dir,
    model_cache_dir,
)
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

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


@pytest.fixture(scope="module")
def moe_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small random Qwen3-MoE (top-3 of 6 experts, each expert's 48 intermediate features split 24 + 24; a dense
    first layer) that speaks the embedded model's tokenizer. transformers' grouped GEMM, its default for experts,
    needs features in multiples of 8 (unit tests cover uneven splits)."""
    embedded = embedded_model_dir()
    model_dir = tmp_path_factory.mktemp("qwen3-moe")
    embedded_config = json.loads((embedded / "config.json").read_text())
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=embedded_config["vocab_size"],
        bos_token_id=embedded_config["bos_token_id"],
        eos_token_id=embedded_config["eos_token_id"],
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=48,
        num_hidden_layers=2,
        mlp_only_layers=[0],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=6,
        num_experts_per_tok=3,
        norm_topk_prob=True,
        max_position_embeddings=MAX_TOTAL_TOKENS,
        initializer_range=0.2,
        tie_word_embeddings=True,
    )
    Qwen3MoeForCausalLM(config).save_pretrained(model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (model_dir / name).symlink_to(embedded / name)
    return model_dir


def _greedy_ids(model_dir: Path, log_dir: Path, num_shard: int, *flags: str) -> list[list[int]]:
    server = TandemServer.start(
        log_dir / f"launcher-{num_shard}{''.join(flags)}.log",
        "--model-id", str(model_dir), *FLOAT32_EAGER, *flags,
        "--num-shard", str(num_shard),
        "--kv-cache-memory", "32MiB",
        "--max-input-tokens", str(MAX_INPUT_TOKENS),
        "--max-total-tokens", str(MAX_TOTAL_TOKENS),
    )  # fmt: skip
    try:
        assert server.info()["num_shard"] == num_shard
        return [server.generate_ids(prompt, MAX_NEW_TOKENS) for prompt in PROMPTS]
    finally:
        assert server.stop() == 0, server.log_tail()


def test_two_shards_serve_a_moe_model_with_the_greedy_tokens_of_one_shard_and_transformers(
    moe_model_dir: Path, tmp_path: Path
) -> None:
    one, two = (_greedy_ids(moe_model_dir, tmp_path, num_shard) for num_shard in (1, 2))
    # Each shard holds three whole experts instead of half of every expert's features.
    experts_split = _greedy_ids(moe_model_dir, tmp_path, 2, "--expert-parallel")
    reference = Reference(moe_model_dir)
    for prompt, single, split, split_by_experts in zip(PROMPTS, one, two, experts_split, strict=True):
        assert len(single) > 0
        reference.assert_same_greedy(prompt, reference.greedy(prompt, MAX_NEW_TOKENS), single)
        reference.assert_same_greedy(prompt, single, split)
        reference.assert_same_greedy(prompt, single, split_by_experts)
