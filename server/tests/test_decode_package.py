"""--torch-compile background on one CPU rank: the one-row decode program, built ahead of time by a child process into
a cached package, serves single streams' steady decode steps with the reference's tokens."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from reference_checks import assert_greedy_matches_generate, warm_for_reference
from shard_testing import StepDriver, make_runner, new_request, write_tiny_checkpoint, write_tiny_llama
from tandem_server.config import CompileMode
from tandem_server.engine.model_runner import ModelRunner
from tandem_server.execution.decode_package import DecodePackageSpec
from tandem_server.execution.decode_package_executor import DecodePackageExecutor
from tandem_server.execution.package_constants import model_tensors
from tandem_server.metrics import CompilationState
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

# The slow tier (a child process compiles with Inductor): `make test` runs it, `make test-fast` does not.
pytestmark = pytest.mark.slow

BUILD_TIMEOUT_S = 600


def package_spec(model_dir: Path, cache_dir: Path, **overrides: object) -> DecodePackageSpec:
    spec = DecodePackageSpec(
        model_path=str(model_dir),
        dtype="float32",
        kv_cache_dtype="float32",
        quantize="none",
        dense_copy_memory=0,
        packed_gemm_rows=(),
        allow_pickle_weights=False,
        num_threads=2,
        cache_dir=str(cache_dir),
    )
    return dataclasses.replace(spec, **overrides)


def package_runner(model_dir: Path, spec: DecodePackageSpec) -> tuple[ModelRunner, DecodePackageExecutor]:
    runner = warm_for_reference(make_runner(model_dir, compile_mode=CompileMode.BACKGROUND, decode_package=spec))
    executor = runner.execution.executor(DecodePackageExecutor)
    assert executor is not None
    return runner, executor


def single_stream_tokens(runner: ModelRunner, prompt: list[int], max_new_tokens: int) -> list[int]:
    assert runner.cache is not None
    driver = StepDriver(runner, num_blocks=runner.cache.num_blocks, chunk_size=16)
    return driver.run([new_request(90, prompt, max_new_tokens)])[90]


def assert_no_weight_resident_twice(
    model: torch.nn.Module, constants: dict[str, torch.Tensor], every_weight_shared: bool
) -> None:
    """Each package constant that equals a model tensor is that tensor (its storage), not a copy of it; with
    `every_weight_shared`, the others are scalars or weights in an autotuned kernel's layout."""
    weights = list(model_tensors(model))
    addresses = {tensor.data_ptr() for tensor in weights}
    weight_sizes = {tensor.numel() for tensor in weights if tensor.dim() == 2}
    copies = [name for name, constant in constants.items() if constant.data_ptr() not in addresses]
    assert len(copies) < len(constants), "no constant is a model tensor"
    for name in copies:
        constant = constants[name]
        twins = [
            w for w in weights if w.dtype == constant.dtype and w.shape == constant.shape and torch.equal(w, constant)
        ]
        assert not twins, f"{name} is a copy of a model tensor"
        # A one-row dense model's program reads its weights as they are, except where autotuning measured Inductor's
        # own blocked GEMM faster on this CPU and keeps that weight in the kernel's layout (an AMD EPYC chose it for
        # the tiny model's 128x64 projections, Intel Xeons never did): only scalars and such re-laid-out weights are
        # the package's own.
        relaid_out = constant.numel() in weight_sizes
        assert not every_weight_shared or constant.numel() == 1 or relaid_out, (
            f"{name} {tuple(constant.shape)} is neither shared nor a model weight in another layout"
        )


def reference_tokens(reference: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        output = reference.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False)  # type: ignore[operator]
    return output[0, len(prompt) :].tolist()


# Qwen3-MoE: the experts' dispatch (sort, grouped GEMMs, scatter-add) exports with the rest of the one-row step, its
# shapes fixed by the row count alone; a dense first layer beside sparse ones.
QWEN3_MOE = {
    "num_experts": 5,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 40,
    "norm_topk_prob": True,
    "mlp_only_layers": [0],
    "head_dim": 16,
}


@pytest.mark.parametrize("family", ["llama", "qwen3-moe"])
def test_a_package_built_beside_serving_takes_over_single_streams_with_the_reference_tokens(
    tmp_path: Path, family: str
) -> None:
    model_dir, cache_dir = tmp_path / "model", tmp_path / "compiled"
    if family == "llama":
        reference = write_tiny_llama(model_dir)
    else:
        reference = write_tiny_checkpoint(model_dir, Qwen3MoeConfig, Qwen3MoeForCausalLM, **QWEN3_MOE)
    runner, executor = package_runner(model_dir, package_spec(model_dir, cache_dir))
    # Warmup returned before the build: steps run eagerly beside it.
    assert runner.compilation() == CompilationState((), compiling=True)
    assert_greedy_matches_generate(model_dir, reference, f"{family}, beside the package build", runner=runner)
    assert executor.wait(BUILD_TIMEOUT_S), executor.failure
    assert executor.built is True and runner.compilation() == CompilationState((1,), compiling=False)
    # The unpacked copy is gone once loaded: nothing of it stays behind when the shard exits.
    extracted = [path for path in Path("/proc/self/maps").read_text().split() if "tandem-decode-package-" in path]
    assert extracted and not any(Path(path).exists() for path in extracted), extracted
    # The package reads the model's own weights: none is resident twice.
    package = executor.package
    assert package is not None
    assert_no_weight_resident_twice(runner.model, package.constants(), every_weight_shared=family == "llama")

    prompt = [5, 17, 33, 2, 71, 9]
    assert single_stream_tokens(runner, prompt, 12) == reference_tokens(reference, prompt, 12)
    # Every decode ran the package, the first after the prefill too: its mirror row was filled first.
    assert executor.steps == 12 - 1
    assert_greedy_matches_generate(model_dir, reference, f"{family}, batched beside the package", runner=runner)


def test_a_second_shard_loads_the_cached_package_and_another_flag_builds_another(tmp_path: Path) -> None:
    model_dir, cache_dir = tmp_path / "model", tmp_path / "compiled"
    reference = write_tiny_llama(model_dir)
    spec = package_spec(model_dir, cache_dir)
    _, first = package_runner(model_dir, spec)
    assert first.wait(BUILD_TIMEOUT_S), first.failure
    package = spec.package_path()
    build_log = package.with_suffix(".log")
    logged_at = build_log.stat().st_mtime_ns

    runner, second = package_runner(model_dir, dataclasses.replace(spec, num_threads=1))
    assert second.wait(BUILD_TIMEOUT_S) and second.built is False
    # No second build ran (it would have rewritten the build's log).
    assert build_log.stat().st_mtime_ns == logged_at
    prompt = [8, 8, 40, 3]
    assert single_stream_tokens(runner, prompt, 8) == reference_tokens(reference, prompt, 8)
    assert second.steps == 8 - 1

    other = dataclasses.replace(spec, kv_cache_dtype="bfloat16")
    assert other.package_path() != package


def test_a_failed_build_leaves_steps_eager_and_names_its_log(tmp_path: Path) -> None:
    model_dir, cache_dir = tmp_path / "model", tmp_path / "compiled"
    reference = write_tiny_llama(model_dir)
    spec = package_spec(model_dir, cache_dir, dtype="float12")
    runner, executor = package_runner(model_dir, spec)
    assert not executor.wait(BUILD_TIMEOUT_S)
    assert executor.failure is not None
    assert "exited with status 1" in executor.failure and "float12" in executor.failure
    assert str(spec.package_path().with_suffix(".log")) in executor.failure
    assert runner.compilation() == CompilationState((), compiling=False)
    assert_greedy_matches_generate(model_dir, reference, "llama, after a failed build", runner=runner)
    assert executor.steps == 0
