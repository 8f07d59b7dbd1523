"""A small random Gemma 4 in its published multimodal layout (a tiny vision tower beside the text decoder) through the
real launcher: the text part loads and gives transformers' greedy tokens on one shard and on two, the prefix cache
changes none, and `/info` reports a KV cache sized per layer (wider global heads, no cache for layers that reuse
another layer's keys and values)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from reference import Reference
from tandem_harness import FLOAT32_EAGER, TandemServer, embedded_model_dir
from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig, Gemma4VisionConfig

MAX_NEW_TOKENS = 16
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n",
    "1, 2, 3, 5, 8, 13,",
)
SLIDING, FULL = "sliding_attention", "full_attention"
# Layers 3 and 4 reuse the keys and values of layers 2 (sliding) and 1 (global).
LAYER_TYPES = [SLIDING, FULL, SLIDING, SLIDING, FULL]
NUM_SHARED_LAYERS = 2
HEAD_DIM, NUM_KV_HEADS = 16, 2
GLOBAL_HEAD_DIM, NUM_GLOBAL_KV_HEADS = 32, 1
# Shorter than the prompts, so the sliding layers' windows decide their tokens.
WINDOW = 6
FLOAT32_BYTES = 4
KV_CACHE_BLOCKS = 10
MAX_TOTAL_TOKENS = 128


def bytes_per_token() -> int:
    """Keys and values of the layers that keep a cache: two sliding layers and one global layer."""
    cached = LAYER_TYPES[: len(LAYER_TYPES) - NUM_SHARED_LAYERS]
    features = sum(
        NUM_KV_HEADS * HEAD_DIM if kind == SLIDING else NUM_GLOBAL_KV_HEADS * GLOBAL_HEAD_DIM for kind in cached
    )
    return 2 * features * FLOAT32_BYTES


@pytest.fixture(scope="module")
def gemma4_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random checkpoint, speaking the embedded model's tokenizer."""
    embedded = embedded_model_dir()
    model_dir = tmp_path_factory.mktemp("gemma4")
    embedded_config = json.loads((embedded / "config.json").read_text())
    text = Gemma4TextConfig(
        vocab_size=embedded_config["vocab_size"],
        vocab_size_per_layer_input=embedded_config["vocab_size"],
        bos_token_id=embedded_config["bos_token_id"],
        eos_token_id=embedded_config["eos_token_id"],
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=len(LAYER_TYPES),
        layer_types=LAYER_TYPES,
        num_attention_heads=4,
        num_key_value_heads=NUM_KV_HEADS,
        head_dim=HEAD_DIM,
        global_head_dim=GLOBAL_HEAD_DIM,
        num_global_key_value_heads=NUM_GLOBAL_KV_HEADS,
        attention_k_eq_v=True,
        num_kv_shared_layers=NUM_SHARED_LAYERS,
        hidden_size_per_layer_input=8,
        sliding_window=WINDOW,
        final_logit_softcapping=30.0,
        max_position_embeddings=MAX_TOTAL_TOKENS,
        initializer_range=0.2,
    )
    vision = Gemma4VisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        patch_size=4,
        position_embedding_size=64,
    )
    torch.manual_seed(0)
    Gemma4ForConditionalGeneration(Gemma4Config(text_config=text, vision_config=vision)).save_pretrained(model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (model_dir / name).symlink_to(embedded / name)
    return model_dir


def _serve(model_dir: Path, log_path: Path, num_shard: int) -> Iterator[TandemServer]:
    kv_cache_bytes = (KV_CACHE_BLOCKS + 1) * 16 * bytes_per_token()
    server = TandemServer.start(
        log_path,
        "--model-id", str(model_dir), *FLOAT32_EAGER,
        "--num-shard", str(num_shard),
        "--kv-cache-memory", str(kv_cache_bytes),
        "--max-input-tokens", str(MAX_TOTAL_TOKENS // 2),
        "--max-total-tokens", str(MAX_TOTAL_TOKENS),
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log_tail()


@pytest.fixture(scope="module")
def one_shard(gemma4_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    yield from _serve(gemma4_dir, tmp_path_factory.mktemp("gemma4-one") / "launcher.log", 1)


@pytest.fixture(scope="module")
def two_shards(gemma4_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    yield from _serve(gemma4_dir, tmp_path_factory.mktemp("gemma4-two") / "launcher.log", 2)


@pytest.fixture(scope="module")
def reference(gemma4_dir: Path) -> Reference:
    return Reference(gemma4_dir)


def test_the_text_part_gives_transformers_greedy_tokens_on_one_shard_and_on_two(
    one_shard: TandemServer, two_shards: TandemServer, reference: Reference
) -> None:
    assert (one_shard.info()["num_shard"], two_shards.info()["num_shard"]) == (1, 2)
    for prompt in PROMPTS:
        single = one_shard.generate_ids(prompt, MAX_NEW_TOKENS)
        split = two_shards.generate_ids(prompt, MAX_NEW_TOKENS)
        assert len(single) > 0
        reference.assert_same_greedy(prompt, reference.greedy(prompt, MAX_NEW_TOKENS), single)
        # Row-parallel sums round differently from one matmul, so only a genuine near-tie may flip a token.
        reference.assert_same_greedy(prompt, single, split)


def test_start_up_says_once_that_the_vision_tower_is_not_loaded(one_shard: TandemServer) -> None:
    log = one_shard.log_path.read_text(errors="replace")
    lines = [line for line in log.splitlines() if "serving its text decoder" in line]
    assert len(lines) == 1, lines
    assert (
        "Gemma4ForConditionalGeneration: serving its text decoder as Gemma4ForCausalLM; not loaded: vision" in lines[0]
    )


def test_info_reports_the_cache_of_the_layers_that_keep_one(one_shard: TandemServer, two_shards: TandemServer) -> None:
    assert one_shard.info()["kv_cache_bytes_per_token"] == bytes_per_token()
    assert one_shard.info()["kv_cache_blocks"] == KV_CACHE_BLOCKS
    # Two ranks split the sliding layers' two KV heads and each hold the global layer's one.
    split = 2 * (2 * (NUM_KV_HEADS // 2) * HEAD_DIM + NUM_GLOBAL_KV_HEADS * GLOBAL_HEAD_DIM) * FLOAT32_BYTES
    assert two_shards.info()["kv_cache_bytes_per_token"] == split


def test_a_repeated_prompt_hits_the_prefix_cache_with_unchanged_tokens(two_shards: TandemServer) -> None:
    prompt = (
        "The town library opens at nine on weekdays and at ten on Saturdays. Books may be borrowed for three weeks "
        "and renewed twice; late books cost ten cents a day, and"
    )
    cold = two_shards.generate_ids(prompt, MAX_NEW_TOKENS)
    hits_before = two_shards.metric("tandem_prefix_cache_hits_tokens_total")
    warm = two_shards.generate_ids(prompt, MAX_NEW_TOKENS)
    assert two_shards.metric("tandem_prefix_cache_hits_tokens_total") - hits_before >= 32
    assert warm == cold
