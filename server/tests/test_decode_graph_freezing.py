"""--torch-compile on a quantized model: one-row decode graphs compile with frozen weights and autotuned GEMMs."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
from shard_testing import StepDriver, decode_graph, load_tiny_model, new_request, write_tiny_llama
from tandem_server.config import CompileMode
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.engine.step import WarmupPlan
from tandem_server.execution.kv_cache import KVCache
from tandem_server.layers.attention import AttentionBackend, TorchAttentionBackend
from tandem_server.quant.kernels import kernels_unavailable_reason
from tandem_server.quant.mode import QuantizeMode
from tandem_server.quant.quantize import quantize_model
from torch._inductor import config as inductor_config

# The slow tier (compiles graphs with Inductor): `make test` runs it, `make test-fast` does not.
pytestmark = pytest.mark.slow

CPU = torch.device("cpu")
KV_CACHE_MEMORY = 4 * 1024 * 1024


@pytest.fixture(autouse=True)
def fresh_compiler() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def runner_for(path: Path, mode: QuantizeMode, compiled: bool) -> ModelRunner:
    """A float32 CPU runner over the tiny checkpoint at `path`, its GEMMs quantized as `mode` says, not yet warmed
    up."""
    model = load_tiny_model(path, backend=TorchAttentionBackend(decode_mirror_memory=KV_CACHE_MEMORY // 2))
    quantize_model(model, mode)
    options = ExecutionOptions(
        kv_cache_memory=KV_CACHE_MEMORY, compile_mode=CompileMode.WARMUP if compiled else CompileMode.OFF
    )
    return ModelRunner(model, (), torch.float32, CPU, options)


def warm_up(runner: ModelRunner) -> ModelRunner:
    runner.warmup(WarmupPlan(block_size=4, max_batch_tokens=32, max_batch_requests=4))
    return runner


def warm_up_recording_compile_settings(runner: ModelRunner) -> list[tuple[int, bool, bool]]:
    """Warms `runner` up, keeping (rows, freezing, autotuning) as each decode-graph warm-up step compiled."""
    graph = decode_graph(runner)
    assert graph is not None
    warm_step = graph._warm_step
    seen: list[tuple[int, bool, bool]] = []

    def recording(cache: KVCache, rows: Sequence[tuple[int, int]], backend: AttentionBackend) -> bool:
        seen.append((len(rows), inductor_config.freezing, inductor_config.max_autotune))
        return warm_step(cache, rows, backend)

    graph._warm_step = recording  # type: ignore[method-assign]
    warm_up(runner)
    return seen


@pytest.mark.parametrize("mode", [QuantizeMode.INT4, QuantizeMode.INT8, QuantizeMode.FP8], ids=lambda mode: mode.value)
def test_a_quantized_models_one_row_decode_graphs_compile_frozen_and_autotuned_and_keep_its_tokens(
    tmp_path: Path, mode: QuantizeMode
) -> None:
    if (reason := kernels_unavailable_reason(CPU, mode)) is not None:
        pytest.skip(reason)
    write_tiny_llama(tmp_path)
    compiled = runner_for(tmp_path, mode, compiled=True)
    # Steps of one request (its first decode, its next one), then of 2 and 4 rows.
    assert warm_up_recording_compile_settings(compiled) == [
        (1, True, True),
        (1, True, True),
        (2, False, False),
        (4, False, False),
    ]
    assert not inductor_config.freezing and not inductor_config.max_autotune
    eager = warm_up(runner_for(tmp_path, mode, compiled=False))
    requests = [new_request(1, list(range(3, 12)), 12), new_request(2, list(range(20, 26)), 12)]
    want = StepDriver(eager, eager.cache.num_blocks, chunk_size=8).run(requests)
    assert decode_graph(compiled) is not None
    steps_before = decode_graph(compiled).steps
    assert StepDriver(compiled, compiled.cache.num_blocks, chunk_size=8).run(requests) == want
    assert decode_graph(compiled).steps > steps_before


def test_an_unquantized_model_compiles_every_decode_graph_as_before(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path)
    compiled = runner_for(tmp_path, QuantizeMode.NONE, compiled=True)
    settings = warm_up_recording_compile_settings(compiled)
    assert settings == [(1, False, False), (1, False, False), (2, False, False), (4, False, False)]
