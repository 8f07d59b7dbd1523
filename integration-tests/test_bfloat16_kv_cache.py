"""`--kv-cache-dtype bfloat16` through the launcher: twice the KV blocks in the same memory, and greedy output that
parts from float32's only at near-ties."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
from tandem_harness import FLOAT32_EAGER, TandemServer, model_cache_dir

PROMPTS = (
    "The three primary colours are",
    "Write one sentence about the sea:",
    "def fibonacci(n):",
)


@pytest.fixture(scope="module")
def bfloat16_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    log_path = tmp_path_factory.mktemp("kv-cache-dtype") / "launcher.log"
    # The same budget as the session's default server, whose cache is float32 like its model.
    flags = ("--kv-cache-memory", "256MiB", "--kv-cache-dtype", "bfloat16")
    server = TandemServer.start(log_path, "--model-cache-dir", str(model_cache_dir()), *FLOAT32_EAGER, *flags)
    yield server
    assert server.stop() == 0, server.log_tail()


def test_a_bfloat16_cache_holds_twice_the_blocks_of_a_float32_one(
    tandem: TandemServer, bfloat16_cache: TandemServer
) -> None:
    for server in (tandem, bfloat16_cache):
        server.generate_ids(PROMPTS[0], max_new_tokens=1)
    float32_blocks = tandem.metric("tandem_kv_blocks_total")
    bfloat16_blocks = bfloat16_cache.metric("tandem_kv_blocks_total")
    assert float32_blocks > 0
    assert 1.98 <= bfloat16_blocks / float32_blocks <= 2.02
    assert "KV cache in bfloat16" in bfloat16_cache.log_path.read_text(errors="replace")


def greedy_tokens(server: TandemServer, prompt: str) -> list[dict[str, Any]]:
    """16 greedy tokens, each with its logprob and the two most likely tokens at its position."""
    parameters = {"max_new_tokens": 16, "details": True, "top_n_tokens": 2}
    body = {"inputs": prompt, "parameters": parameters}
    response = requests.post(f"{server.base_url}/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    details = response.json()["details"]
    return [{**token, "top": top} for token, top in zip(details["tokens"], details["top_tokens"], strict=True)]


def test_a_bfloat16_cache_follows_float32_greedy_decoding_up_to_near_ties(
    tandem: TandemServer, bfloat16_cache: TandemServer
) -> None:
    # Measured bound (benchmark/scripts/dtype_agreement.py): a bfloat16 cache under the float32 embedded model agreed
    # with float32 on 384 of 384 greedy positions, its logits within 0.18. So until the two outputs part, every
    # token's logprob agrees closely, and they can part only where float32's choice was a near-tie for bfloat16.
    for prompt in PROMPTS:
        want, got = greedy_tokens(tandem, prompt), greedy_tokens(bfloat16_cache, prompt)
        for expected, actual in zip(want, got, strict=True):
            if expected["id"] != actual["id"]:
                runner_up = {token["id"]: token["logprob"] for token in actual["top"]}
                assert expected["id"] in runner_up, f"{prompt!r}: float32's token is not bfloat16's runner-up"
                assert actual["logprob"] - runner_up[expected["id"]] < 0.1, f"{prompt!r}: parted at no near-tie"
                break
            assert abs(actual["logprob"] - expected["logprob"]) < 0.05, prompt
