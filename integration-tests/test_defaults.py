"""The server a user gets without flags: the embedded GGUF's own quantized blocks, activations in bfloat16 where the
CPU multiplies it natively, bfloat16 copies for batches there, and single streams' decode graphs compiled beside
serving. The shard says what it chose and why, and greedy output parts from the float32 server's only at near-ties,
alone and batched, while the graphs compile and once they serve."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from near_ties import assert_follows_up_to_near_ties, greedy_tokens
from tandem_harness import TandemServer, model_cache_dir
from tandem_server.weight_defaults import cpu_multiplies_bfloat16

PROMPTS = (
    "The three primary colours are",
    "Write one sentence about the sea:",
    "def fibonacci(n):",
    "The capital of France is",
    "Name three animals that live in the ocean:",
    "Tell me a fact about the moon:",
    "Once upon a time",
)
BFLOAT16_CPU = cpu_multiplies_bfloat16()


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The compile cache of this module's servers: empty until the first one has built its package."""
    return tmp_path_factory.mktemp("compiled")


@pytest.fixture(scope="module")
def defaults(tmp_path_factory: pytest.TempPathFactory, compile_cache: Path) -> Iterator[TandemServer]:
    log_path = tmp_path_factory.mktemp("defaults") / "launcher.log"
    server = TandemServer.start(
        log_path,
        "--model-cache-dir",
        str(model_cache_dir()),
        "--compile-cache-dir",
        str(compile_cache),
        compile_in_background=True,
    )
    yield server
    assert server.stop() == 0, server.log_tail()


def test_the_shard_states_each_default_and_why(defaults: TandemServer) -> None:
    log = defaults.log_path.read_text(errors="replace")
    assert "--quantize gguf: the model is a GGUF: its quantized blocks are served as they are" in log, log
    assert "30 qkv_proj: Q4_1 as int4" in log
    assert "--cuda-graphs 0: a CUDA option" in log
    assert "--packed-gemm-rows 32: decode batches of up to 32 rows multiply by prepacked weights on CPU" in log
    assert "--kv-cache-memory 270MiB: room for 12288 tokens of 23040 bytes (30 layers x 3 kv heads x 64" in log
    assert "--decode-mirror-memory 203MiB: three quarters of the KV cache" in log
    assert "--torch-compile background: single streams' decode steps move to a graph compiled ahead of time" in log
    if BFLOAT16_CPU:
        assert "--dtype bfloat16: the CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX)" in log
        assert "--quantized-dense-memory auto: bfloat16 copies serve batches" in log
        assert "bfloat16 copies for batches of 6+ rows: 121 weights" in log
    else:
        assert "--dtype float32: the CPU has neither AVX-512 BF16 nor AMX" in log
        assert "quantized weights get no bfloat16 copies for batches: this CPU has no bfloat16 matrix" in log


def test_default_greedy_output_follows_float32_up_to_near_ties_alone_and_batched(
    tandem: TandemServer, defaults: TandemServer
) -> None:
    want = [greedy_tokens(tandem, prompt) for prompt in PROMPTS]
    for prompt, expected in zip(PROMPTS, want, strict=True):
        assert_follows_up_to_near_ties(expected, greedy_tokens(defaults, prompt), prompt)
    # Seven at once: prompts and decode steps of 6 or more rows multiply by the bfloat16 copies.
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(greedy_tokens, [defaults] * len(PROMPTS), PROMPTS))
    for prompt, expected, actual in zip(PROMPTS, want, together, strict=True):
        assert_follows_up_to_near_ties(expected, actual, prompt)


# The embedded model's one-row decode graphs compile in about a minute on 2 quiet cores; far longer beside other work.
COMPILE_TIMEOUT_S = 900.0


def _info_once_compiled(server: TandemServer) -> dict[str, Any]:
    deadline = time.monotonic() + COMPILE_TIMEOUT_S
    info = _info_after_a_step(server)
    while info["compiling"]:
        assert time.monotonic() < deadline, f"still compiling after {COMPILE_TIMEOUT_S:.0f}s: {info}"
        time.sleep(5.0)
        info = _info_after_a_step(server)
    return info


def _info_after_a_step(server: TandemServer) -> dict[str, Any]:
    # /info reports what has compiled as of the shards' latest step.
    greedy_tokens(server, PROMPTS[0])
    response = requests.get(f"{server.base_url}/info", timeout=10)
    assert response.status_code == 200, response.text
    info: dict[str, Any] = response.json()
    return info


def test_single_stream_graphs_compile_in_the_background_and_take_over_with_the_same_output(
    tandem: TandemServer, defaults: TandemServer
) -> None:
    # The greedy test above ran its steps beside the child process building the package.
    info = _info_once_compiled(defaults)
    log = defaults.log_path.read_text(errors="replace")
    assert "decode package: built and loaded" in log, defaults.log_tail()
    assert info["compiled_decode_rows"] == 1, info
    for prompt in PROMPTS:
        assert_follows_up_to_near_ties(greedy_tokens(tandem, prompt), greedy_tokens(defaults, prompt), prompt)


# The default shard's resident memory on the embedded model once its decode package serves, its KV cache included:
# the cache and the decode mirror become resident as they fill. With the 1 GiB cache of earlier defaults, after a
# 32-stream benchmark: 1,365 MiB (peak 1,479 MiB, while loading), where the package's own copy of the weights made it
# 1,581 MiB; with the 270 MiB cache `auto` gives it, at most 1,401 MiB with the cache filled twice over
# (`tandem-bench kv-memory`, docs/benchmarks.md).
SHARD_RSS_LIMIT = int(1.5 * 2**30)


def test_the_default_shard_stays_within_its_memory_budget_while_serving(defaults: TandemServer) -> None:
    # Runs after the background compile finished (the test above waits for it).
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        list(pool.map(greedy_tokens, [defaults] * len(PROMPTS) * 4, PROMPTS * 4))
    shards = [
        child
        for child in psutil.Process(defaults.process.pid).children(recursive=True)
        if any("tandem-shard" in part for part in child.cmdline()[:2])
    ]
    assert len(shards) == 1
    assert shards[0].memory_info().rss <= SHARD_RSS_LIMIT, f"{shards[0].memory_info().rss / 2**20:.0f} MiB"


def test_a_restart_loads_the_compiled_package_from_the_cache(
    defaults: TandemServer, compile_cache: Path, tmp_path: Path
) -> None:
    # Runs after the first server built its package (the test above waits for it).
    server = TandemServer.start(
        tmp_path / "launcher.log",
        "--model-cache-dir",
        str(model_cache_dir()),
        "--compile-cache-dir",
        str(compile_cache),
        compile_in_background=True,
    )
    try:
        info = _info_once_compiled(server)
        log = server.log_path.read_text(errors="replace")
        assert "decode package: loaded" in log and "decode package: building" not in log, server.log_tail()
        assert info["compiled_decode_rows"] == 1, info
        # The same package over the same weights: the same tokens.
        for prompt in PROMPTS[:3]:
            assert greedy_tokens(server, prompt) == greedy_tokens(defaults, prompt), prompt
    finally:
        assert server.stop() == 0, server.log_tail()
