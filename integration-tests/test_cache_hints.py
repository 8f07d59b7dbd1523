"""Prompt-cache hints through the real stack: a prompt sent with `prompt_cache_retention` keeps its cached prefix
while later traffic evicts every other idle block, even though it is the least recently used; an unhinted prompt of
the same age is evicted. Requests that need every block still get them: the hint yields. A hint Tandem does not serve
is a 400 naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
from tandem_harness import FLOAT32_EAGER, TandemServer, write_tiny_llama

BLOCK_SIZE = 16
# Six whole blocks and one token more: a repeat can reuse all six.
PROMPT_TOKENS = 6 * BLOCK_SIZE + 1


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    root = tmp_path_factory.mktemp("hints")
    write_tiny_llama(root / "model")
    server = TandemServer.start(
        root / "launcher.log",
        "--model-id", str(root / "model"), *FLOAT32_EAGER,
        # 32 blocks of 16 tokens for this model's float32 keys and values.
        "--kv-cache-memory", "256KiB",
        "--max-input-tokens", "200",
        "--max-total-tokens", "256",
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log_tail()


def prompt(first_token: int) -> list[int]:
    """Token ids no other prompt of this file shares."""
    return list(range(first_token, first_token + PROMPT_TOKENS))


def complete(server: TandemServer, tokens: list[int], max_tokens: int = 1, **hints: Any) -> int:
    """Sends a completion; the prompt tokens it found cached."""
    body = {"prompt": tokens, "max_tokens": max_tokens, "ignore_eos": True, **hints}
    response = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return int(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_a_retained_prompt_survives_the_eviction_of_every_other_idle_block(small_cache: TandemServer) -> None:
    kv_blocks = requests.get(f"{small_cache.base_url}/info", timeout=10).json()["kv_cache_blocks"]
    hinted, unhinted = prompt(1000), prompt(1200)
    assert complete(small_cache, hinted, prompt_cache_retention="24h") == 0
    assert complete(small_cache, unhinted) == 0
    evictions_before = small_cache.metric("tandem_prefix_cache_evictions_total")
    # Enough distinct prompts after them that LRU alone would evict both: each leaves six idle blocks.
    for index in range(kv_blocks // 6 + 1):
        assert complete(small_cache, prompt(2000 + index * 200)) == 0
    assert small_cache.metric("tandem_prefix_cache_evictions_total") - evictions_before >= 12
    assert complete(small_cache, unhinted) == 0, "the unhinted prompt, as old, was evicted"
    assert complete(small_cache, hinted) == 6 * BLOCK_SIZE, "the retained prompt kept all its blocks"

    # Two requests of 16 blocks each at once need all 32: the retained blocks are evicted, and both are served.
    long_prompts = [list(range(first, first + 200)) for first in (5000, 5400)]
    with ThreadPoolExecutor(2) as pool:
        cached = list(pool.map(lambda tokens: complete(small_cache, tokens, max_tokens=56), long_prompts))
    assert cached == [0, 0]
    assert complete(small_cache, hinted) < 6 * BLOCK_SIZE, "under real memory pressure the hint yielded"


def test_a_hint_tandem_does_not_serve_is_refused_naming_the_field(small_cache: TandemServer) -> None:
    body = {"prompt": "The river", "max_tokens": 1, "prompt_cache_options": {"ttl": "1d"}}
    refused = requests.post(f"{small_cache.base_url}/v1/completions", json=body, timeout=30)
    assert refused.status_code == 400, refused.text
    assert "`prompt_cache_options.ttl` must be `30m` or `12h`" in refused.json()["error"]["message"]
