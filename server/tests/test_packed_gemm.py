"""CPU prepacked GEMMs (MKL float32, oneDNN bfloat16): the dense path's numbers, for the row counts they fit."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from shard_testing import load_tiny_model, write_tiny_llama
from tandem_server.cli import config_from_args
from tandem_server.errors import ConfigError
from tandem_server.execution.batch import ScheduledSpan, build_step_batch
from tandem_server.execution.eager import forward_step
from tandem_server.execution.kv_cache import CacheGeometry, KVCache
from tandem_server.layers.gemm import GemmModule
from tandem_server.layers.linear import RowParallelLinear, StackedColumns
from tandem_server.models.registry import CausalLM
from tandem_server.quant.packed import (
    ONEDNN_MAX_ROWS,
    OneDnnPackedWeight,
    PackedFormat,
    PackedGemm,
    PackedWeight,
    pack_gemm_weights,
    packing_available,
    packing_summary,
)

CPU = torch.device("cpu")
needs_mkl = pytest.mark.skipif(
    packing_available(CPU, torch.float32) is not None, reason="this torch build cannot prepack GEMMs"
)
needs_onednn_bf16 = pytest.mark.skipif(
    packing_available(CPU, torch.bfloat16) is not None, reason="this CPU or torch build has no oneDNN bfloat16"
)


class Spy(GemmModule):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gemm(x, None)


def test_packing_is_a_cpu_float32_or_bfloat16_path() -> None:
    assert packing_available(CPU, torch.float16) is not None
    assert packing_available(torch.device("cuda"), torch.float32) is not None
    assert packing_available(torch.device("cuda"), torch.bfloat16) is not None


def test_the_start_up_log_names_what_packing_builds_for_each_dtype() -> None:
    assert packing_summary(torch.float32, (16, 32)) == "MKL float32 copies for 16,32-row batches"
    assert packing_summary(torch.bfloat16, (16, 32)) == "one oneDNN bfloat16 copy for batches of up to 256 rows"


@needs_mkl
@pytest.mark.parametrize("rows", [24, 30, 32])
def test_batches_that_fill_a_packed_count_use_it_and_match_dense(rows: int) -> None:
    torch.manual_seed(rows)
    weight, bias, x = torch.randn(48, 40), torch.randn(48), torch.randn(rows, 40)
    packed = PackedWeight(weight, (32,))
    assert packed.fitting_rows(rows) == 32
    out = packed.linear(x, bias, 32)
    assert out.shape == (rows, 48)
    torch.testing.assert_close(out, F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)


@needs_mkl
def test_small_or_large_batches_fall_back_to_dense() -> None:
    packed = PackedWeight(torch.randn(8, 16), (16, 32))
    # 16 * 0.75 = 12 and 32 * 0.75 = 24: 11 rows would be mostly padding, 33 do not fit any copy.
    assert [packed.fitting_rows(rows) for rows in (1, 11, 12, 16, 17, 23, 24, 32, 33)] == [
        None, None, 16, 16, None, None, 32, 32, None,
    ]  # fmt: skip


@needs_mkl
def test_gemm_module_routes_by_row_count(monkeypatch: pytest.MonkeyPatch) -> None:
    module = Spy(torch.randn(8, 16))
    pack_gemm_weights(module, (32,))
    assert isinstance(module.weight_format, PackedFormat)
    calls = _count_calls(monkeypatch, PackedWeight)
    module(torch.randn(4, 16))
    module(torch.randn(28, 16))
    assert calls == [32]


@needs_mkl
def test_packing_a_model_covers_every_gemm_once_and_keeps_logits(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path, tie_word_embeddings=False)
    model = load_tiny_model(tmp_path)
    gemms = [module for module in model.modules() if isinstance(module, GemmModule)]
    # Per layer: the fused QKV, o_proj, the fused gate/up, down_proj; plus the LM head. Stacked members stay dense.
    assert len(gemms) == 4 * 2 + 1
    assert sum(isinstance(m, StackedColumns) for m in gemms) == 4
    assert sum(isinstance(m, RowParallelLinear) for m in gemms) == 4
    logits = _decode_logits(model, torch.float32)
    dense = logits()
    added = pack_gemm_weights(model, (32,))
    packed = logits()
    weights = sum(module.weight.numel() * 4 for module in gemms)
    assert added >= weights
    torch.testing.assert_close(packed, dense, atol=1e-4, rtol=1e-4)
    assert torch.equal(packed.argmax(-1), dense.argmax(-1))


def _decode_logits(model: CausalLM, dtype: torch.dtype) -> Callable[[], torch.Tensor]:
    """Computes the logits of one fixed decode step of 32 rows over 20-token contexts, each time it is called."""
    batch = _decode_batch(rows=32, context=20)
    spec = model.spec
    cache = KVCache(CacheGeometry(spec.num_layers, 16, spec.num_kv_heads, spec.head_dim, dtype), 64, CPU)

    def logits() -> torch.Tensor:
        with torch.inference_mode():
            return model.compute_logits(forward_step(model, batch, cache.layers))

    return logits


def _decode_batch(rows: int, context: int):
    blocks_per_request = -(-(context + 1) // 16)
    spans = [
        ScheduledSpan([3 + row % 50], context, list(range(row * blocks_per_request, (row + 1) * blocks_per_request)))
        for row in range(rows)
    ]
    return build_step_batch(spans, 16, CPU)


def test_shard_flag_defaults_to_32_on_cpu_and_off_on_cuda(tmp_path: Path) -> None:
    base = ["--model-path", str(tmp_path), "--uds-path", str(tmp_path / "s.sock")]
    assert config_from_args(base).packed_gemm_rows == (32,)
    assert config_from_args([*base, "--packed-gemm-rows", "32,16,32"]).packed_gemm_rows == (16, 32)
    assert config_from_args([*base, "--packed-gemm-rows", "0"]).packed_gemm_rows == ()
    assert config_from_args([*base, "--device", "cuda"]).packed_gemm_rows == ()
    with pytest.raises(ConfigError, match="--packed-gemm-rows is a CPU option"):
        config_from_args([*base, "--device", "cuda", "--packed-gemm-rows", "32"])
    with pytest.raises(ConfigError, match="--packed-gemm-rows must be comma-separated"):
        config_from_args([*base, "--packed-gemm-rows", "32,many"])


@needs_onednn_bf16
@pytest.mark.parametrize("rows", [1, 7, 32, 100, ONEDNN_MAX_ROWS])
def test_onednn_bfloat16_copy_serves_any_batch_up_to_its_limit_with_dense_numbers(rows: int) -> None:
    torch.manual_seed(rows)
    weight, bias = torch.randn(96, 40).bfloat16(), torch.randn(96).bfloat16()
    x = torch.randn(rows, 40).bfloat16()
    packed = OneDnnPackedWeight(weight, (32,))
    assert packed.fitting_rows(rows) == rows
    assert packed.nbytes == weight.numel() * 2
    out = packed.linear(x, bias, rows)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, F.linear(x, weight, bias))


@needs_onednn_bf16
def test_onednn_bfloat16_leaves_prefill_sized_batches_dense() -> None:
    module = Spy(torch.randn(8, 16).bfloat16())
    pack_gemm_weights(module, (32,))
    assert isinstance(module.weight_format, PackedFormat)
    assert isinstance(module.weight_format.packed, OneDnnPackedWeight)
    assert module.weight_format.packed.fitting_rows(ONEDNN_MAX_ROWS + 1) is None
    x = torch.randn(ONEDNN_MAX_ROWS + 1, 16).bfloat16()
    assert torch.equal(module(x), F.linear(x, module.weight))


@needs_onednn_bf16
def test_packing_a_bfloat16_model_runs_every_gemm_packed_with_the_same_logits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tiny_llama(tmp_path, tie_word_embeddings=True)
    model = load_tiny_model(tmp_path, dtype=torch.bfloat16)
    logits = _decode_logits(model, torch.bfloat16)
    dense = logits()
    added = pack_gemm_weights(model, (32,))
    calls = _count_calls(monkeypatch, OneDnnPackedWeight)
    packed = logits()
    gemms = [module for module in model.modules() if isinstance(module, GemmModule)]
    assert len(calls) == len(gemms) == 4 * 2 + 1
    assert added == sum(module.weight.numel() * 2 for module in gemms)
    assert torch.equal(packed, dense)


def _count_calls(monkeypatch: pytest.MonkeyPatch, packed_class: type[PackedGemm]) -> list[int]:
    """Records the row count of every packed GEMM `packed_class` runs from now on."""
    calls: list[int] = []
    original = packed_class.linear

    def recording(self: PackedGemm, x: torch.Tensor, bias: torch.Tensor | None, rows: int) -> torch.Tensor:
        calls.append(rows)
        return original(self, x, bias, rows)

    monkeypatch.setattr(packed_class, "linear", recording)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_compiled_graph_calls_packed_gemms_whose_weights_are_its_inputs(dtype: torch.dtype) -> None:
    # Inductor lowers torch's own packed GEMMs only with a constant weight; a compiled layer's weights are inputs.
    if packing_available(CPU, dtype) is not None:
        pytest.skip(f"no prepacked {dtype} GEMMs here")
    torch._dynamo.reset()
    torch.manual_seed(0)
    module = Spy(torch.randn(48, 40).to(dtype))
    pack_gemm_weights(module, (8,))
    x = torch.randn(8, 40).to(dtype)

    def stage(layer: Spy, rows: torch.Tensor) -> torch.Tensor:
        return torch.relu(layer(rows)) * 2

    with torch.inference_mode():
        compiled = torch.compile(stage, fullgraph=True)(module, x)
        assert torch.equal(compiled, stage(module, x))
    torch._dynamo.reset()
