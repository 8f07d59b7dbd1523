"""Only eager execution applies LoRA deltas: CUDA graphs, the compiled decode graphs and the decode package decline
every step with adapter rows (which then runs eagerly) and keep serving the steps without."""

from __future__ import annotations

import pytest
import torch
from lora_testing import AdapterSpec, write_adapter
from shard_testing import CPU, make_runner, warmed, write_tiny_llama
from tandem_server.config import CompileMode
from tandem_server.engine.model_runner import ModelRunner
from tandem_server.execution import decode_package_executor
from tandem_server.execution.batch import ScheduledSpan, StepBatch, build_step_batch
from tandem_server.execution.compiled_decode import CompiledExecutor
from tandem_server.execution.cuda_graphs import CudaGraphExecutor
from tandem_server.execution.decode_package import DecodePackageSpec
from tandem_server.execution.decode_package_executor import DecodePackageExecutor
from tandem_server.execution.eager import EagerExecutor, forward_step
from tandem_server.execution.protocol import PlannedStep, StepExecutor
from tandem_server.layers.attention import PreparedStep


class ServesEverything:
    """Stands in for what a fast executor captured or compiled: it would run any step, eagerly, and counts them."""

    def __init__(self, runner: ModelRunner) -> None:
        self._runner = runner
        self.steps = 0

    def holds(self, batch: StepBatch) -> bool:
        return True

    def serves(self, metadata: object) -> bool:
        return True

    def run(self, batch: StepBatch) -> torch.Tensor:
        self.steps += 1
        cache = self._runner.cache
        assert cache is not None
        return forward_step(self._runner.model, batch, cache.layers)

    def forward(self, batch: StepBatch, prepared: PreparedStep) -> torch.Tensor:
        return self.run(batch)


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> ModelRunner:
    root = tmp_path_factory.mktemp("lora-executors")
    reference = write_tiny_llama(root / "model")
    runner = warmed(make_runner(root / "model"))
    runner.lora.load("values", write_adapter(root / "values", reference, AdapterSpec(8, 16, ("v_proj",))))
    return runner


def fast_executors(runner: ModelRunner, monkeypatch: pytest.MonkeyPatch) -> list[tuple[StepExecutor, object]]:
    """Each fast executor with its graphs or package replaced by one that would serve every step."""
    graphs = CudaGraphExecutor(runner.model, CPU)
    graphs.graphs = ServesEverything(runner)  # type: ignore[assignment]
    compiled = CompiledExecutor(runner.model, CompileMode.BACKGROUND, runner.execution.gate)
    compiled.graph = ServesEverything(runner)  # type: ignore[assignment]
    unused = DecodePackageSpec("unused", "float32", "float32", "none", 0, (), False, 1, "unused")
    package = DecodePackageExecutor(runner.model, unused)
    package._package = ServesEverything(runner)  # type: ignore[assignment]
    monkeypatch.setattr(decode_package_executor, "is_single_mirror_decode", lambda batch, metadata: True)
    monkeypatch.setattr(decode_package_executor, "steady_program_arguments", lambda batch, prepared: batch)
    monkeypatch.setattr(decode_package_executor, "flat_inputs", lambda batch: batch)
    return [(graphs, graphs.graphs), (compiled, compiled.graph), (package, package._package)]


def planned(runner: ModelRunner, adapter: str) -> PlannedStep:
    cache = runner.cache
    assert cache is not None
    lora = runner.lora.step([adapter], [2], CPU)
    batch = build_step_batch([ScheduledSpan([7, 9], 0, [cache.reserved_block])], cache.block_size, CPU, lora)
    return PlannedStep(batch, cache.layers, runner.model.backend)


def test_fast_executors_serve_base_steps_and_decline_steps_with_adapter_rows(
    runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    for executor, _ in fast_executors(runner, monkeypatch):
        assert executor.serves(planned(runner, "")), executor.name
        assert not executor.serves(planned(runner, "values")), executor.name


@torch.inference_mode()
def test_a_step_with_adapter_rows_runs_eagerly_and_one_without_on_the_fast_executor(
    runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    execution = runner.execution
    for executor, inner in fast_executors(runner, monkeypatch):
        monkeypatch.setattr(execution, "executors", (executor, EagerExecutor(runner.model)))
        base = execution.forward(planned(runner, "").batch, planned(runner, "").layers)
        assert inner.steps == 1, executor.name  # type: ignore[attr-defined]
        adapted = execution.forward(planned(runner, "values").batch, planned(runner, "values").layers)
        assert inner.steps == 1, executor.name  # type: ignore[attr-defined]
        # The eager step applied the adapter: the value projection changed, so did the hidden state.
        assert not torch.equal(base, adapted)
