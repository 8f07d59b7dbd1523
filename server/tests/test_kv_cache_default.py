"""`--kv-cache-memory auto`: room for a fixed number of tokens of the model, within 1 GiB and the machine's memory,
logged with the reason; a given size is kept, and CUDA sizes its cache from free device memory as before."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from shard_testing import CPU, load_tiny_model, warmed, write_tiny_llama
from tandem_server.cli import config_from_args
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.engine.warmup import cpu_cache_budget, describe_geometry
from tandem_server.errors import ConfigError
from tandem_server.execution.kv_cache import CacheGeometry
from tandem_server.kv_cache_default import (
    AUTO_KV_MAX_BYTES,
    AUTO_KV_TOKENS,
    CacheFootprint,
    auto_kv_cache_memory,
    parse_kv_cache_memory,
)
from tandem_server.layers.attention import TorchAttentionBackend

MIB = 2**20
GIB = 2**30
SHARD = ["--model-path", "m", "--uds-path", "s"]
# SmolLM2-135M (the embedded model): 30 layers x 3 kv heads x 64 dims, keys and values in bfloat16.
SMOLLM2 = CacheGeometry(num_layers=30, block_size=16, num_kv_heads=3, head_dim=64, dtype=torch.bfloat16)
# Llama 3 8B: 32 layers x 8 kv heads x 128 dims in bfloat16.
LLAMA3_8B = CacheGeometry(num_layers=32, block_size=16, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)
PLENTY = 64 * GIB


def footprint(geometry: CacheGeometry) -> CacheFootprint:
    return CacheFootprint(geometry.bytes_per_token, describe_geometry(geometry), reserved_tokens=geometry.block_size)


def test_auto_gives_the_embedded_model_room_for_12288_tokens_and_says_why() -> None:
    budget, reason = auto_kv_cache_memory(footprint(SMOLLM2), PLENTY, ranks_on_node=1)
    assert SMOLLM2.bytes_per_token == 23_040 and AUTO_KV_TOKENS == 12_288
    # The router gets all 12288 tokens: the block reserved for health checks comes on top.
    assert budget == (12_288 + 16) * 23_040
    assert reason == (
        "--kv-cache-memory 270MiB: room for 12288 tokens of 23040 bytes (30 layers x 3 kv heads x 64 x keys and "
        "values in bfloat16)"
    )


def test_auto_never_takes_more_than_one_gib() -> None:
    budget, reason = auto_kv_cache_memory(footprint(LLAMA3_8B), PLENTY, ranks_on_node=1)
    assert budget == AUTO_KV_MAX_BYTES == GIB
    assert reason.endswith("would take over 1024MiB, so it holds 8176 tokens")


def test_auto_takes_at_most_a_quarter_of_the_available_memory_split_between_ranks() -> None:
    budget, reason = auto_kv_cache_memory(footprint(SMOLLM2), available_bytes=GIB, ranks_on_node=2)
    assert budget == 128 * MIB
    assert "a quarter of the 1024MiB available, split between 2 ranks, so it holds 5809 tokens" in reason


def test_auto_counts_the_draft_models_tokens_beside_the_models() -> None:
    budget = cpu_cache_budget(None, SMOLLM2, SMOLLM2, ranks_on_node=1)
    assert budget == 2 * (12_288 + 16) * 23_040


def test_a_given_size_is_kept_as_given() -> None:
    assert parse_kv_cache_memory("512MiB") == 512 * MIB
    assert parse_kv_cache_memory(" auto ") is None
    assert cpu_cache_budget(3 * GIB, LLAMA3_8B, None, ranks_on_node=1) == 3 * GIB
    given = config_from_args([*SHARD, "--kv-cache-memory", "2GiB"])
    assert (given.kv_cache_memory, given.decode_mirror_memory) == (2 * GIB, GIB)
    with pytest.raises(ConfigError, match="invalid size 'lots'"):
        config_from_args([*SHARD, "--kv-cache-memory", "lots"])


def test_the_flag_defaults_to_auto_and_the_mirror_follows_the_cache_warmup_sizes() -> None:
    cpu = config_from_args(SHARD)
    assert (cpu.kv_cache_memory, cpu.decode_mirror_memory) == (None, None)
    reasons = " ".join(cpu.auto_reasons)
    assert "--decode-mirror-memory auto: three quarters of the KV cache, sized with it at Warmup" in reasons


def test_cuda_keeps_no_mirror_and_sizes_its_cache_from_device_memory() -> None:
    cuda = config_from_args([*SHARD, "--device", "cuda"])
    assert (cuda.kv_cache_memory, cuda.decode_mirror_memory, cuda.cuda_memory_fraction) == (None, 0, 0.9)
    assert config_from_args([*SHARD, "--device", "cuda", "--kv-cache-memory", "2GiB"]).kv_cache_memory == 2 * GIB


def test_warmup_sizes_an_auto_cache_from_the_model_and_mirrors_half_of_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_tiny_llama(tmp_path)
    backend = TorchAttentionBackend(decode_mirror_memory=None)
    model = load_tiny_model(tmp_path, backend=backend)
    runner = ModelRunner(model, (), torch.float32, CPU, ExecutionOptions(kv_cache_memory=None))
    with caplog.at_level(logging.INFO):
        cache = warmed(runner).cache
    assert cache is not None
    # Blocks of 4 tokens, every one of the tokens for the router; one more block is reserved for health checks.
    assert cache.num_blocks == AUTO_KV_TOKENS // 4
    assert backend.mirror is not None and backend.mirror.budget_bytes == cache.nbytes * 3 // 4
    assert f"room for {AUTO_KV_TOKENS} tokens of {cache.geometry.bytes_per_token} bytes" in caplog.text
    assert "--decode-mirror-memory" in caplog.text and "three quarters of the KV cache" in caplog.text
