"""`--quantize gguf` through the launcher: the embedded GGUF's own Q4_1/Q8_0 blocks served as int4/int8, in a
sixth of float32's weight memory, with greedy output that parts from the float32 server's only at near-ties."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
from tandem_harness import TandemServer, model_cache_dir
from tandem_server.layers import dense_copies

PROMPTS = (
    "The three primary colours are",
    "Write one sentence about the sea:",
    "def fibonacci(n):",
    "The capital of France is",
)
# Both servers multiply by the same values (the float32 conversion is the blocks' exact dequantization, and the
# quantized scales are those values' bfloat16 roundings); the quantized GEMMs take and give bfloat16. Measured on 8
# held-out prompts x 16 tokens: logprobs within 0.07 of float32's until the first departure, departures only where
# float32's runner-up was within 0.1 of its choice.
LOGPROB_TOLERANCE = 0.3
NEAR_TIE = 0.3


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    log_path = tmp_path_factory.mktemp("quantize-gguf") / "launcher.log"
    server = TandemServer.start(log_path, "--model-cache-dir", str(model_cache_dir()), "--quantize", "gguf")
    yield server
    assert server.stop() == 0, server.log_tail()


def test_the_shard_serves_the_gguf_blocks_as_int4_and_int8(quantized: TandemServer) -> None:
    log = quantized.log_path.read_text(errors="replace")
    report = re.search(r"weights take ([\d.]+) MiB: (.*)", log)
    assert report is not None, quantized.log_tail()
    assert float(report.group(1)) < 100  # float32: 513 MiB; the GGUF's tensors: 92 MiB
    assert "30 qkv_proj: Q4_1 as int4" in report.group(2)
    assert "1 lm_head: Q8_0 as int8 in groups of 32" in report.group(2)


def test_info_reports_each_weights_format_and_their_bytes(tandem: TandemServer, quantized: TandemServer) -> None:
    served = requests.get(f"{quantized.base_url}/info", timeout=10).json()
    assert "qkv_proj: Q4_1 as int4" in served["model_weights_format"]
    assert "lm_head: Q8_0 as int8 in groups of 32" in served["model_weights_format"]
    assert served["model_weight_bytes"] < 100 * 2**20
    float32 = requests.get(f"{tandem.base_url}/info", timeout=10).json()
    assert "qkv_proj: float32" in float32["model_weights_format"]
    assert float32["model_weight_bytes"] > 5 * served["model_weight_bytes"]


def greedy_tokens(server: TandemServer, prompt: str) -> list[dict[str, Any]]:
    """16 greedy tokens, each with its logprob and the two most likely tokens at its position."""
    parameters = {"max_new_tokens": 16, "details": True, "top_n_tokens": 2}
    response = requests.post(
        f"{server.base_url}/generate", json={"inputs": prompt, "parameters": parameters}, timeout=60
    )
    assert response.status_code == 200, response.text
    details = response.json()["details"]
    return [{**token, "top": top} for token, top in zip(details["tokens"], details["top_tokens"], strict=True)]


def assert_follows_up_to_near_ties(want: list[dict[str, Any]], got: list[dict[str, Any]], what: str) -> None:
    """`got` has `want`'s tokens (logprobs close) until it departs where `want`'s runner-up was a near-tie."""
    for expected, actual in zip(want, got, strict=True):
        if expected["id"] != actual["id"]:
            top = {token["id"]: token["logprob"] for token in expected["top"]}
            assert actual["id"] in top, f"{what}: the departing token is not the runner-up"
            assert expected["logprob"] - top[actual["id"]] < NEAR_TIE, f"{what}: parted at no near-tie"
            return
        assert abs(actual["logprob"] - expected["logprob"]) < LOGPROB_TOLERANCE, what


def test_quantized_greedy_decoding_follows_float32_up_to_near_ties(
    tandem: TandemServer, quantized: TandemServer
) -> None:
    for prompt in PROMPTS:
        assert_follows_up_to_near_ties(greedy_tokens(tandem, prompt), greedy_tokens(quantized, prompt), prompt)


def test_batched_quantized_decoding_follows_unbatched_up_to_near_ties(quantized: TandemServer) -> None:
    # float32 rows differ by ~1e-5 between batch shapes (attention's summation order); the bfloat16 activations of
    # the quantized GEMMs can round such a difference to one bfloat16 step (logits moved by up to 0.25, measured), so
    # batching may flip a near-tie, never a clear choice.
    alone = [greedy_tokens(quantized, prompt) for prompt in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(greedy_tokens, [quantized] * len(PROMPTS), PROMPTS))
    for prompt, want, got in zip(PROMPTS, alone, together, strict=True):
        assert_follows_up_to_near_ties(want, got, prompt)


@pytest.fixture(scope="module")
def quantized_with_copies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    if dense_copies.unavailable_reason(auto=False) is not None:
        pytest.skip(f"no dense copies here: {dense_copies.unavailable_reason(auto=False)}")
    log_path = tmp_path_factory.mktemp("quantize-gguf-copies") / "launcher.log"
    flags = ("--quantize", "gguf", "--quantized-dense-memory", "1GiB")
    server = TandemServer.start(log_path, "--model-cache-dir", str(model_cache_dir()), *flags)
    yield server
    assert server.stop() == 0, server.log_tail()


def test_dense_copies_serve_prompts_and_batches_following_float32_up_to_near_ties(
    tandem: TandemServer, quantized_with_copies: TandemServer
) -> None:
    served = requests.get(f"{quantized_with_copies.base_url}/info", timeout=10).json()
    assert "dense copies: bfloat16 for batches of 6+ rows" in served["model_weights_format"]
    # 90.7 MiB of quantized weights and a bfloat16 copy of every one (135M values).
    assert 300 * 2**20 < served["model_weight_bytes"] < 400 * 2**20
    # Prefills of 6 tokens or more multiply by the copies, and so do the decode steps of up to 12 concurrent requests
    # while 6 or more of them are running.
    prompts = [*PROMPTS, "Name three animals that live in the ocean:", "Tell me a fact about the moon:"] * 2
    want = [greedy_tokens(tandem, prompt) for prompt in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(greedy_tokens, [quantized_with_copies] * len(prompts), prompts))
    for prompt, expected, actual in zip(prompts, want, got, strict=True):
        assert_follows_up_to_near_ties(expected, actual, prompt)


@pytest.fixture(scope="module")
def quantized_compiled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    log_path = tmp_path_factory.mktemp("quantize-gguf-compiled") / "launcher.log"
    # A small step budget keeps Warmup's compiles few (steps of 1 to 64 rows).
    flags = ("--quantize", "gguf", "--torch-compile", "--max-batch-prefill-tokens", "64")
    server = TandemServer.start(log_path, "--model-cache-dir", str(model_cache_dir()), *flags)
    yield server
    assert server.stop() == 0, server.log_tail()


def test_compiled_layers_serve_greedy_output_following_float32_up_to_near_ties(
    tandem: TandemServer, quantized_compiled: TandemServer
) -> None:
    # Compiling reorders float32 roundings the way any kernel change does; through the bfloat16 activations that
    # moves logits as much as a 1e-7 relative change of the embeddings does (measured: up to 0.5 to 0.65).
    log = quantized_compiled.log_path.read_text(errors="replace")
    assert "the stages of 30 decoder layers compile at Warmup" in log, quantized_compiled.log_tail()
    assert "compiled steps of 1, 2, 4, 8, 16, 32, 64 rows" in log, quantized_compiled.log_tail()
    for prompt in PROMPTS:
        assert_follows_up_to_near_ties(greedy_tokens(tandem, prompt), greedy_tokens(quantized_compiled, prompt), prompt)
