"""KV offload through the real stack: a prompt whose blocks were evicted from a small KV cache is served again from
the host tier, or from the disk tier behind it, with the tokens and log-probabilities of a cache hit, bit for bit;
a torn disk entry is detected, counted and recomputed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from tandem_harness import FLOAT32_EAGER, TandemServer, write_tiny_llama

BLOCK_SIZE = 16
# Six whole blocks and one token more: a repeat can reuse all six.
PROMPT_TOKENS = 6 * BLOCK_SIZE + 1
REUSABLE_TOKENS = 6 * BLOCK_SIZE
# The tiny model's float32 keys and values: 8 KiB a block, so 256KiB is 32 blocks.
KV_CACHE = "256KiB"


def start(root: Path, *offload: str) -> TandemServer:
    write_tiny_llama(root / "model")
    return TandemServer.start(
        root / "launcher.log",
        "--model-id", str(root / "model"), *FLOAT32_EAGER,
        "--kv-cache-memory", KV_CACHE,
        "--max-input-tokens", "200",
        "--max-total-tokens", "256",
        *offload,
    )  # fmt: skip


@pytest.fixture(scope="module")
def host_tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    server = start(tmp_path_factory.mktemp("offload-host"), "--kv-offload-memory", "4MiB")
    yield server
    assert server.stop() == 0, server.log_tail()


@pytest.fixture(scope="module")
def disk_tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TandemServer, Path]]:
    root = tmp_path_factory.mktemp("offload-disk")
    # Room for 6 blocks in host memory, so older entries move to disk.
    flags = ("--kv-offload-memory", "48KiB", "--kv-offload-dir", str(root / "tier"), "--kv-offload-disk", "4MiB")
    server = start(root, *flags)
    yield server, root / "tier" / "rank-0"
    assert server.stop() == 0, server.log_tail()


def prompt(first_token: int) -> list[int]:
    """Token ids no other prompt of this file shares."""
    return list(range(first_token, first_token + PROMPT_TOKENS))


def complete(server: TandemServer, tokens: list[int]) -> tuple[int, list[str], list[float]]:
    """A greedy completion of 8 tokens: the prompt tokens it found cached, its tokens and their log-probabilities."""
    body: dict[str, Any] = {"prompt": tokens, "max_tokens": 8, "ignore_eos": True, "logprobs": 1, "temperature": 0}
    response = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    answer = response.json()
    logprobs = answer["choices"][0]["logprobs"]
    cached = int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])
    return cached, logprobs["tokens"], logprobs["token_logprobs"]


def evict_everything(server: TandemServer, first_token: int) -> None:
    """Sends distinct prompts, each leaving six cached blocks, until LRU has evicted more blocks than the KV cache
    holds: every block cached before is gone from it."""
    kv_blocks = requests.get(f"{server.base_url}/info", timeout=10).json()["kv_cache_blocks"]
    evictions_before = server.metric("tandem_prefix_cache_evictions_total")
    for index in range(2 * kv_blocks // 6 + 1):
        complete(server, prompt(first_token + index * 200))
    assert server.metric("tandem_prefix_cache_evictions_total") - evictions_before >= kv_blocks


def test_an_evicted_prompt_is_loaded_back_from_host_memory_bit_equal(host_tier: TandemServer) -> None:
    tokens = prompt(1000)
    computed = complete(host_tier, tokens)
    hit = complete(host_tier, tokens)
    assert (computed[0], hit[0]) == (0, REUSABLE_TOKENS)
    evict_everything(host_tier, 3000)
    loaded_before = host_tier.metric("tandem_kv_offload_loaded_blocks_total", medium="CPU")
    reloaded = complete(host_tier, tokens)
    assert reloaded[0] == REUSABLE_TOKENS, "the evicted prefix came back from the host tier"
    assert host_tier.metric("tandem_kv_offload_loaded_blocks_total", medium="CPU") - loaded_before == 6
    assert reloaded == hit, "a reloaded prefix answers exactly as a prefix still in the cache"
    assert reloaded[1] == computed[1]
    assert host_tier.metric("tandem_kv_offload_stored_blocks_total", medium="CPU") >= 6


def test_a_prefix_pushed_to_disk_is_fetched_and_a_torn_entry_is_recomputed(
    disk_tier: tuple[TandemServer, Path],
) -> None:
    server, directory = disk_tier
    tokens = prompt(1000)
    computed = complete(server, tokens)
    hit = complete(server, tokens)
    evict_everything(server, 3000)
    assert server.metric("tandem_kv_offload_stored_blocks_total", medium="DISK") >= 6
    fetched_before = server.metric("tandem_kv_offload_loaded_blocks_total", medium="DISK")
    fetched = complete(server, tokens)
    assert fetched[0] == REUSABLE_TOKENS, "the prefix came back from disk"
    assert server.metric("tandem_kv_offload_loaded_blocks_total", medium="DISK") > fetched_before
    assert fetched == hit

    evict_everything(server, 6000)
    entries = sorted(directory.glob("*.kv"))
    assert entries, "entries on disk"
    for entry in entries:
        data = bytearray(entry.read_bytes())
        data[-1] ^= 0xFF
        entry.write_bytes(bytes(data))
    failures_before = server.metric("tandem_kv_offload_failed_reads_total")
    recomputed = complete(server, tokens)
    assert server.metric("tandem_kv_offload_failed_reads_total") > failures_before
    assert recomputed[0] < REUSABLE_TOKENS, "torn blocks are computed, never served"
    assert recomputed[1] == computed[1]
