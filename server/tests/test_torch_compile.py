"""--torch-compile: compiled layer stages give the reference's numbers, and Warmup compiles every graph steps need."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
from reference_checks import Target, assert_greedy_matches_generate, assert_mixed_steps_match_logits, warm_for_reference
from shard_testing import (
    StepDriver,
    background_compile,
    decode_graph,
    make_runner,
    new_request,
    write_tiny_checkpoint,
    write_tiny_llama,
)
from tandem_server.config import CompileMode
from tandem_server.engine.model_runner import ModelRunner
from tandem_server.errors import ConfigError
from tandem_server.execution.compiled_layers import require_cpp_compiler, warmup_rows
from tandem_server.execution.kv_cache import KVCache
from tandem_server.layers.attention import AttentionBackend
from tandem_server.metrics import CompilationState
from tandem_server.quant.packed import pack_gemm_weights
from test_families_numerics import write_family
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, PreTrainedModel, Qwen2MoeConfig, Qwen2MoeForCausalLM

# The slow tier (compiles graphs with Inductor): `make test` runs it, `make test-fast` does not.
pytestmark = pytest.mark.slow

# Gemma 3's layer is the other StagedLayer class: norms around both blocks, q/k norms, local and global rotary.
GEMMA3 = {
    "num_hidden_layers": 2,
    "head_dim": 16,
    "num_key_value_heads": 1,
    "layer_types": ["sliding_attention", "full_attention"],
    "sliding_window": 4,
    "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
    },
}

# Mixture-of-experts layers (routed top-3 of 5 experts and a gated shared expert) beside a dense one: the dispatch's
# shapes follow the token count alone, so their graphs compile once per row class like the dense layers'.
QWEN2_MOE = {
    "num_experts": 5,
    "num_experts_per_tok": 3,
    "moe_intermediate_size": 24,
    "shared_expert_intermediate_size": 40,
    "mlp_only_layers": [1],
}


def write_checkpoint(path: Path, family: str) -> PreTrainedModel:
    """Llama, Gemma 3 and Qwen2-MoE as set up here; any other family as its numerics test writes it."""
    if family == "llama":
        return write_tiny_llama(path)
    if family == "gemma3":
        return write_tiny_checkpoint(path, Gemma3TextConfig, Gemma3ForCausalLM, **GEMMA3)
    if family == "qwen2-moe":
        return write_tiny_checkpoint(path, Qwen2MoeConfig, Qwen2MoeForCausalLM, **QWEN2_MOE)
    return write_family(path, family)


@pytest.fixture(autouse=True)
def fresh_compiler() -> Iterator[None]:
    """Every test compiles from scratch: graphs of an earlier test's model must not serve (or count for) this one."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled_graphs() -> int:
    return counters["stats"]["unique_graphs"]


def forward_graphs(runner: ModelRunner) -> list[object]:
    """The compiled graphs of the runner's model's whole forward pass (its decode graphs)."""
    assert decode_graph(runner) is not None
    return _debug_get_cache_entry_list(decode_graph(runner).code)


def record_graph_fits(runner: ModelRunner) -> list[tuple[int, bool]]:
    """Each decode-graph step from now on: its rows, and whether it fits one of the compiled graphs (passes its
    guards)."""
    graph = decode_graph(runner)
    assert graph is not None
    fits: list[tuple[int, bool]] = []
    run = graph._run

    def checked_run(input_ids: object, positions: object, kv_cache: object, metadata: object) -> object:
        frame = {"self": runner.model, "input_ids": input_ids, "positions": positions, "kv_cache": kv_cache}
        # The forward's defaults: no recurrent states, no given input embeddings.
        frame.update(metadata=metadata, states=None, embeddings=None)
        fit = any(entry.guard_manager.check(frame) for entry in forward_graphs(runner))
        fits.append((len(input_ids), fit))  # type: ignore[arg-type]
        return run(input_ids, positions, kv_cache, metadata)

    graph._run = checked_run
    return fits


def test_compiled_llama_layers_match_transformers_logits(tmp_path: Path) -> None:
    reference = write_tiny_llama(tmp_path)
    assert_mixed_steps_match_logits(tmp_path, reference, "llama compiled", Target(compiled=True))
    assert compiled_graphs() > 0


@pytest.mark.parametrize("family", ["gemma3", "qwen2-moe"])
def test_compiled_layers_of_other_layouts_match_transformers_logits(tmp_path: Path, family: str) -> None:
    reference = write_checkpoint(tmp_path, family)
    assert_mixed_steps_match_logits(tmp_path, reference, f"{family} compiled", Target(compiled=True))
    assert compiled_graphs() > 0


# Layer variants of their own: NoPE layers beside rotating ones, interleaved partial rotary with post-norms, query and
# key norms over the whole projection, scaled residual branches.
@pytest.mark.parametrize(
    "family",
    [
        "smollm3-nope-list-sliding-yarn",
        "glm4-interleaved-partial-rotary",
        "olmo3-full-width-qk-norm-sliding-yarn",
        "granite-multipliers",
    ],
)
def test_compiled_layers_of_newer_families_match_transformers_logits(tmp_path: Path, family: str) -> None:
    reference = write_family(tmp_path, family)
    assert_mixed_steps_match_logits(tmp_path, reference, f"{family} compiled", Target(compiled=True))
    assert compiled_graphs() > 0


@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen2-moe"])
def test_warmup_compiles_every_graph_that_staggered_greedy_generation_needs(tmp_path: Path, family: str) -> None:
    reference = write_checkpoint(tmp_path, family)
    runner = warm_for_reference(make_runner(tmp_path, compile_mode=CompileMode.WARMUP))
    after_warmup = compiled_graphs()
    assert decode_graph(runner) is not None
    warmup_steps = decode_graph(runner).steps
    # Steps of one request (twice), then of 2, 4 and 8; one graph per size-1 specialisation: one row with one
    # mirror fill, one row with several, several rows (the tiny model's GEMMs have no row thresholds).
    assert after_warmup > 0 and decode_graph(runner).compiled_rows == (1, 2, 4, 8) and len(forward_graphs(runner)) == 3
    fits = record_graph_fits(runner)
    assert_greedy_matches_generate(tmp_path, reference, f"{family} compiled", runner=runner)
    # A request alone: its first decode fills its whole 9-token prompt into the mirror, more than Warmup's did.
    StepDriver(runner, num_blocks=runner.cache.num_blocks, chunk_size=16).run([new_request(50, list(range(3, 12)), 4)])
    assert compiled_graphs() == after_warmup
    # Run-only mode runs a step no graph fits eagerly, silently: every step found one.
    assert fits and all(fit for _, fit in fits), fits
    # The steps where every request decoded (the others carry prompt chunks) ran through the decode graphs Warmup
    # compiled.
    assert decode_graph(runner).steps > warmup_steps


def test_after_warmup_a_decode_step_no_graph_fits_runs_eagerly_instead_of_compiling(tmp_path: Path) -> None:
    reference = write_tiny_llama(tmp_path)
    runner = warm_for_reference(make_runner(tmp_path, compile_mode=CompileMode.WARMUP))
    assert decode_graph(runner) is not None
    assert len(forward_graphs(runner)) == 3
    warmup_steps = decode_graph(runner).steps
    # Every compiled graph dropped: no decode step finds one that fits, and none may compile while requests wait.
    torch._dynamo.reset()
    assert_greedy_matches_generate(tmp_path, reference, "llama, decode graphs dropped", runner=runner)
    assert decode_graph(runner).steps > warmup_steps
    assert forward_graphs(runner) == []


def test_two_models_of_one_class_each_decode_through_their_own_graphs(tmp_path: Path) -> None:
    # The decode graphs skip the guards on module attributes: a model of the same class and cache geometry but
    # another MLP width must not run graphs compiled for the first one.
    narrow, wide = tmp_path / "narrow", tmp_path / "wide"
    references = {narrow: write_tiny_llama(narrow), wide: write_tiny_llama(wide, seed=1, intermediate_size=192)}
    runners = {path: warm_for_reference(make_runner(path, compile_mode=CompileMode.WARMUP)) for path in references}
    for path, runner in runners.items():
        assert len(forward_graphs(runner)) == 3
        assert_greedy_matches_generate(path, references[path], f"compiled {path.name} llama", runner=runner)


def test_compiled_layers_call_prepacked_gemms_inside_their_graphs(tmp_path: Path) -> None:
    # The launcher packs float32 GEMM weights for some row counts on every CPU shard (--packed-gemm-rows); Inductor
    # refused to lower a packed GEMM whose weight is a graph input, and Warmup failed.
    reference = write_tiny_llama(tmp_path)
    runner = make_runner(tmp_path, compile_mode=CompileMode.WARMUP)
    assert pack_gemm_weights(runner.model, (2, 4)) > 0
    warm_for_reference(runner)
    assert_greedy_matches_generate(tmp_path, reference, "llama compiled, packed GEMMs", runner=runner)


def test_warmup_rows_cross_every_power_of_two_up_to_the_limit() -> None:
    assert warmup_rows(1) == (1,)
    assert warmup_rows(64) == (1, 2, 4, 8, 16, 32, 64)
    assert warmup_rows(100) == (1, 2, 4, 8, 16, 32, 64, 100)


def test_compiling_without_a_cpp_compiler_fails_at_start_up_naming_the_flag() -> None:
    # Inductor's own patching: monkeypatch's undo deletes the option, which breaks later compiles in this process.
    with (
        inductor_config.patch({"cpp.cxx": ("tandem-no-such-compiler",)}),
        pytest.raises(ConfigError, match="--torch-compile needs a C\\+\\+ compiler"),
    ):
        require_cpp_compiler()


# `--torch-compile auto` on the CPU is `background`.
@pytest.mark.parametrize("family", ["llama", "qwen2-moe"])
def test_a_background_compile_serves_beside_steps_and_its_one_row_graphs_take_over_single_streams(
    tmp_path: Path, family: str
) -> None:
    reference = write_checkpoint(tmp_path, family)
    runner = warm_for_reference(make_runner(tmp_path, compile_mode=CompileMode.BACKGROUND))
    compiling, graph = background_compile(runner), decode_graph(runner)
    assert compiling is not None and graph is not None
    # Warmup compiled nothing: the thread compiles its first graph (seconds) after Warmup returned.
    assert runner.compilation() == CompilationState((), compiling=True)
    # Steps run beside the compile, through every torch.fx trace Inductor makes (each holds them back): the
    # reference tokens every time.
    rounds_during_compile = 0
    while compiling.running:
        assert_greedy_matches_generate(tmp_path, reference, f"{family}, beside a background compile", runner=runner)
        rounds_during_compile += 1
    assert rounds_during_compile > 0
    assert compiling.join(timeout=600) and compiling.error is None
    assert runner.compilation() == CompilationState((1,), compiling=False)
    fits = record_graph_fits(runner)
    assert_greedy_matches_generate(tmp_path, reference, f"{family}, compiled in the background", runner=runner)
    # A request alone, then: a single stream's decode steps run its graph; batched ones run eagerly, as run-only
    # mode does when none fits.
    StepDriver(runner, num_blocks=runner.cache.num_blocks, chunk_size=16).run([new_request(50, list(range(3, 12)), 6)])
    single_stream = [fit for rows, fit in fits if rows == 1]
    assert len(single_stream) >= 5 and all(single_stream), fits


def test_warming_up_again_stops_a_background_compile_first(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path)
    runner = warm_for_reference(make_runner(tmp_path, compile_mode=CompileMode.BACKGROUND))
    first = background_compile(runner)
    assert first is not None
    warm_for_reference(runner)
    assert not first.running and first.error is None
    assert background_compile(runner) is not None and background_compile(runner) is not first
    background_compile(runner).stop()


def test_without_a_decode_mirror_nothing_compiles_in_the_background(tmp_path: Path) -> None:
    reference = write_tiny_llama(tmp_path)
    runner = make_runner(tmp_path, decode_mirror_memory=0, compile_mode=CompileMode.BACKGROUND)
    warm_for_reference(runner)
    assert background_compile(runner) is None
    assert_greedy_matches_generate(tmp_path, reference, "llama, no mirror to compile for", runner=runner)
    assert runner.compilation().compiled_decode_rows == () and not runner.compilation().compiling


def test_a_row_count_counts_as_compiled_once_all_its_steps_have_and_warmup_counts_afresh(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path)
    runner = make_runner(tmp_path, compile_mode=CompileMode.WARMUP)
    graph = decode_graph(runner)
    assert graph is not None
    seen: list[tuple[int, ...]] = []
    warm_step = graph._warm_step

    def recording(cache: KVCache, rows: Sequence[tuple[int, int]], backend: AttentionBackend) -> bool:
        seen.append(graph.compiled_rows)
        return warm_step(cache, rows, backend)

    graph._warm_step = recording  # type: ignore[method-assign]
    warm_for_reference(runner)
    # One row compiles twice (its first decode fills several mirror positions, the next one) before it serves.
    assert seen == [(), (), (1,), (1, 2), (1, 2, 4)]
    assert graph.compiled_rows == (1, 2, 4, 8)
    warm_for_reference(runner)
    assert graph.compiled_rows == (1, 2, 4, 8)
