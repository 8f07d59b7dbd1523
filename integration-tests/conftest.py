"""Session servers booted through `tandem-launcher` on the embedded model, and the transformers reference."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from metrics_scrape import KEY_NAME, MetricsTandem
from reference import Reference
from tandem_harness import FLOAT32_EAGER, MAX_INPUT_TOKENS, MAX_TOTAL_TOKENS, TandemServer, free_port, model_cache_dir
from tandem_launcher.config import EMBEDDED_MODEL_ID
from tandem_launcher.model_resolution import ModelSource, resolve_source


def _serve(tmp_path_factory: pytest.TempPathFactory, name: str, *flags: str) -> Iterator[TandemServer]:
    log_path = tmp_path_factory.mktemp(name) / "launcher.log"
    server = TandemServer.start(log_path, "--model-cache-dir", str(model_cache_dir()), *flags)
    yield server
    status = server.stop()
    assert status == 0, f"tandem-launcher exited with {status} after SIGTERM:\n{server.log_tail()}"


@pytest.fixture(scope="session")
def tandem(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    """The float32 server, whose greedy tokens and logprobs equal the `transformers` reference's; the first session
    converts the embedded model (minutes), later ones reuse it. The defaults serve quantized blocks in bfloat16 where
    the CPU allows, which follow it up to near ties (`test_defaults.py`)."""
    yield from _serve(
        tmp_path_factory,
        "tandem",
        *FLOAT32_EAGER,
        "--kv-cache-memory", "256MiB",
        "--max-input-tokens", str(MAX_INPUT_TOKENS),
        "--max-total-tokens", str(MAX_TOTAL_TOKENS),
        "--max-best-of", "3",
    )  # fmt: skip


@pytest.fixture(scope="session")
def tiny_kv_tandem(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    """A KV cache of about 32 blocks of 16 tokens (SmolLM2 needs 46 KB per token in float32), so requests get
    preempted."""
    yield from _serve(
        tmp_path_factory,
        "tiny-kv",
        *FLOAT32_EAGER,
        "--kv-cache-memory", "24MiB",
        "--max-input-tokens", "127",
        "--max-total-tokens", "256",
    )  # fmt: skip


@pytest.fixture(scope="session")
def metrics_tandem(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsTandem]:
    """Serves the metrics tests; rank 0's shard metrics port is picked free, and its one key is named."""
    port = free_port()
    api_key = "metrics-test-key"
    key_file = tmp_path_factory.mktemp("metrics-keys") / "keys.txt"
    key_file.write_text(f"{api_key} name={KEY_NAME}\n")
    flags = ["--kv-cache-memory", "128MiB", "--shard-metrics-port", str(port), "--api-key-file", str(key_file)]
    for server in _serve(tmp_path_factory, "metrics", *flags):
        yield MetricsTandem(server, port, api_key)


@pytest.fixture(scope="session")
def reference(tandem: TandemServer) -> Reference:
    """transformers on the very directory the launcher converted (so it exists once `tandem` is up)."""
    model_dir: Path = resolve_source(ModelSource(EMBEDDED_MODEL_ID, None, model_cache_dir())).path
    return Reference(model_dir)
