"""`--quantize gguf` through the launcher: the embedded GGUF's own Q4_1/Q8_0 blocks served as int4/int8, in a
sixth of float32's weight memory, with greedy output that parts from the float32 server's only at near-ties."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from near_ties import assert_follows_up_to_near_ties, greedy_tokens
from tandem_harness import TandemServer, model_cache_dir
from tandem_server.quant import dense_copies

PROMPTS = (
    "The three primary colours are",
    "Write one sentence about the sea:",
    "def fibonacci(n):",
    "The capital of France is",
)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    log_path = tmp_path_factory.mktemp("quantize-gguf") / "launcher.log"
    flags = ("--quantize", "gguf", "--quantized-dense-memory", "0")  # the blocks alone, without bfloat16 copies
    server = TandemServer.start(log_path, "--model-cache-dir", str(model_cache_dir()), *flags)
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
    # Small step budgets keep Warmup's compiles few: layer stages for steps of 1 to 16 rows (across the bfloat16
    # copies' threshold), decode graphs for 1, 2 and 4 rows.
    flags = ("--quantize", "gguf", "--torch-compile", "--max-batch-prefill-tokens", "16", "--max-batch-size", "4")
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
    assert "compiled steps of 1, 2, 4, 8, 16 rows" in log, quantized_compiled.log_tail()
    assert "decode-step graphs for 1, 2, 4 rows compiled" in log, quantized_compiled.log_tail()
    for prompt in PROMPTS:
        assert_follows_up_to_near_ties(greedy_tokens(tandem, prompt), greedy_tokens(quantized_compiled, prompt), prompt)
