"""A small random DeepSeek-V3 (multi-head latent attention, grouped routing, a dense first layer, low-rank queries)
through the real launcher: `--num-shard 2` gives the greedy tokens of one shard, the prefix cache and preemption
change none, and `/info` reports a KV cache of one latent and rotary-key row per token and layer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from reference import Reference
from tandem_harness import FLOAT32_EAGER, TandemServer, embedded_model_dir
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

MAX_NEW_TOKENS = 16
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n",
    "1, 2, 3, 5, 8, 13,",
)
# Sizes that all differ, so a mixed-up dimension cannot pass; 4 heads split 2 + 2 over two shards.
LATENT = {"kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12}
NUM_HEADS = 4
NUM_LAYERS = 3
FLOAT32_BYTES = 4
# Ten blocks of 16 tokens: preemption test requests need three blocks each.
KV_CACHE_BLOCKS = 10
MAX_TOTAL_TOKENS = 128


def latent_bytes_per_token() -> int:
    """The latent and the rotary key, per layer."""
    return (LATENT["kv_lora_rank"] + LATENT["qk_rope_head_dim"]) * NUM_LAYERS * FLOAT32_BYTES


def per_head_bytes_per_token() -> int:
    """What the same model would cache with per-head keys and values."""
    key = LATENT["qk_nope_head_dim"] + LATENT["qk_rope_head_dim"]
    return NUM_HEADS * (key + LATENT["v_head_dim"]) * NUM_LAYERS * FLOAT32_BYTES


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random checkpoint, speaking the embedded model's tokenizer."""
    embedded = embedded_model_dir()
    model_dir = tmp_path_factory.mktemp("deepseek-v3")
    embedded_config = json.loads((embedded / "config.json").read_text())
    torch.manual_seed(0)
    config = DeepseekV3Config(
        vocab_size=embedded_config["vocab_size"],
        bos_token_id=embedded_config["bos_token_id"],
        eos_token_id=embedded_config["eos_token_id"],
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=NUM_LAYERS,
        first_k_dense_replace=1,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_HEADS,
        q_lora_rank=48,
        **LATENT,
        n_routed_experts=8,
        n_group=4,
        topk_group=2,
        num_experts_per_tok=3,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        max_position_embeddings=MAX_TOTAL_TOKENS,
        initializer_range=0.2,
        tie_word_embeddings=True,
    )
    DeepseekV3ForCausalLM(config).save_pretrained(model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (model_dir / name).symlink_to(embedded / name)
    return model_dir


def _serve(model_dir: Path, log_path: Path, num_shard: int) -> Iterator[TandemServer]:
    kv_cache_bytes = (KV_CACHE_BLOCKS + 1) * 16 * latent_bytes_per_token()
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
def one_shard(deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    yield from _serve(deepseek_dir, tmp_path_factory.mktemp("mla-one") / "launcher.log", 1)


@pytest.fixture(scope="module")
def two_shards(deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    yield from _serve(deepseek_dir, tmp_path_factory.mktemp("mla-two") / "launcher.log", 2)


@pytest.fixture(scope="module")
def reference(deepseek_dir: Path) -> Reference:
    return Reference(deepseek_dir)


def test_two_shards_give_the_greedy_tokens_of_one_shard_and_transformers(
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


def test_info_reports_one_latent_row_per_token_and_layer(one_shard: TandemServer, two_shards: TandemServer) -> None:
    """Each rank keeps the whole latent (heads split, latent replicated), so both report the same size."""
    for server in (one_shard, two_shards):
        info = server.info()
        assert info["kv_cache_bytes_per_token"] == latent_bytes_per_token(), info
        assert info["kv_cache_blocks"] == KV_CACHE_BLOCKS, info
    reported = one_shard.info()["kv_cache_bytes_per_token"]
    ratio = per_head_bytes_per_token() / reported
    print(f"KV bytes per token: {reported} latent, {per_head_bytes_per_token()} per head, {ratio:.2f} times fewer")
    # Per layer, 4 heads of 24 key and 12 value features against a 32-feature latent and an 8-feature rotary key.
    assert ratio == pytest.approx(4 * (24 + 12) / (32 + 8))


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


def test_preempted_requests_keep_their_alone_tokens(two_shards: TandemServer, reference: Reference) -> None:
    prompts = [f"Story {i}: the old keeper heard a knock on the door, set down his lantern and" for i in range(8)]
    max_new_tokens = 24
    blocks_per_request = -(-(len(reference.encode(prompts[0])) + max_new_tokens) // 16)
    assert blocks_per_request * len(prompts) > 2 * KV_CACHE_BLOCKS
    preemptions_before = two_shards.metric("tandem_preemptions_total")
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        together = list(pool.map(lambda prompt: two_shards.generate_ids(prompt, max_new_tokens), prompts))
    assert two_shards.metric("tandem_preemptions_total") > preemptions_before
    for prompt, ids in zip(prompts, together, strict=True):
        assert ids == two_shards.generate_ids(prompt, max_new_tokens), prompt
