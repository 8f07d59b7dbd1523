"""Dense bfloat16 copies of quantized CPU weights: which GEMMs use them, what they multiply by, and the memory bound."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tandem_server.config import ShardConfig, parse_quantized_dense_memory
from tandem_server.errors import ConfigError
from tandem_server.layers.gemm import GemmModule
from tandem_server.quant import dense_copies
from tandem_server.quant.dense_copies import DENSE_COPY_MIN_ROWS, DenseCopyFormat
from tandem_server.quant.int4.weight import Int4Weight
from tandem_server.quant.int8.weight import Int8GroupsWeight, Int8Weight
from tandem_server.quant.kernels import QuantizedWeight
from tandem_server.quant.values import Int4Groups, Int8Groups, quantize_int4, quantize_int8
from torch import nn

pytestmark = pytest.mark.skipif(
    dense_copies.unavailable_reason(auto=False) is not None, reason="no oneDNN bfloat16 kernels here"
)


class _Gemm(GemmModule):
    def __init__(self, quantized: QuantizedWeight) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(0), requires_grad=False)
        self.use_quantized(quantized)


def _weight(out_features: int, in_features: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(seed))


def _assert_bfloat16_product(actual: torch.Tensor, x: torch.Tensor, values: torch.Tensor) -> None:
    """`actual` is `x @ values.T` as bfloat16 operands accumulated in float32 compute it."""
    expected = F.linear(x.bfloat16().float(), values.bfloat16().float())
    magnitude = F.linear(x.abs(), values.abs())
    assert ((actual - expected).abs() <= 2**-7 * magnitude + 1e-4).all()


def _int8_groups(weight: torch.Tensor) -> Int8Groups:
    groups = weight.view(weight.shape[0], -1, 32)
    scale = groups.abs().amax(-1) / 127
    q = torch.round(groups / scale.unsqueeze(-1)).to(torch.int8).view_as(weight)
    return Int8Groups(q, scale)


@pytest.mark.parametrize(
    "make",
    [
        lambda w: Int4Weight(quantize_int4(w)),
        lambda w: Int8Weight(quantize_int8(w)),
        lambda w: Int8GroupsWeight(_int8_groups(w)),
    ],
    ids=["int4", "int8", "int8-groups"],
)
def test_dense_values_are_what_the_quantized_kernel_multiplies_by(make) -> None:  # type: ignore[no-untyped-def]
    quantized = make(_weight(96, 128))
    values = quantized.dense_values()
    assert values is not None and values.shape == (96, 128)
    x = torch.randn(3, 128)
    _assert_bfloat16_product(quantized.linear(x, None), x, values)


def test_dense_values_of_an_act_order_weight_follow_the_checkpoints_input_order() -> None:
    groups = quantize_int4(_weight(64, 128))
    order = torch.randperm(128, generator=torch.Generator().manual_seed(1))
    quantized = Int4Weight(Int4Groups(groups.q, groups.scale, groups.zero, groups.group_size, order))
    values = quantized.dense_values()
    assert values is not None
    x = torch.randn(2, 128)
    _assert_bfloat16_product(quantized.linear(x, None), x, values)


def test_batches_from_the_threshold_multiply_by_the_copy_and_smaller_ones_by_the_kernel() -> None:
    quantized = Int4Weight(quantize_int4(_weight(128, 64)))
    module = _Gemm(quantized)
    bias = torch.randn(128)
    small = torch.randn(DENSE_COPY_MIN_ROWS - 1, 64)
    large = torch.randn(DENSE_COPY_MIN_ROWS, 64)
    before = module.gemm(large, bias)
    assert torch.equal(before, quantized.linear(large, bias))

    made = dense_copies.add_dense_copies(module, budget=2**30)
    assert made == dense_copies.DenseCopies(made=1, left=0, nbytes=128 * 64 * 2)
    assert torch.equal(module.gemm(small, bias), quantized.linear(small, bias))
    after = module.gemm(large, bias)
    assert not torch.equal(after, before)
    values = quantized.dense_values()
    assert values is not None
    _assert_bfloat16_product(after - bias, large, values)


def test_copies_stop_at_the_memory_given() -> None:
    model = nn.Sequential(*(_Gemm(Int4Weight(quantize_int4(_weight(64, 64, seed)))) for seed in range(3)))
    one_copy = 64 * 64 * 2
    made = dense_copies.add_dense_copies(model, budget=2 * one_copy + one_copy // 2)
    assert (made.made, made.left, made.nbytes) == (2, 1, 2 * one_copy)
    assert [isinstance(module.weight_format, DenseCopyFormat) for module in model] == [True, True, False]
    untouched = nn.Sequential(_Gemm(Int4Weight(quantize_int4(_weight(64, 64)))))
    assert dense_copies.add_dense_copies(untouched, budget=0) == dense_copies.DenseCopies(made=0, left=1, nbytes=0)
    assert untouched[0].weight_format is untouched[0].weight_format.quantized


def test_the_memory_flag_takes_a_size_or_auto_and_is_refused_on_cuda() -> None:
    assert parse_quantized_dense_memory("auto") is None
    assert parse_quantized_dense_memory("0") == 0
    assert parse_quantized_dense_memory("512MiB") == 512 * 2**20
    with pytest.raises(ConfigError, match="invalid size"):
        parse_quantized_dense_memory("lots")
    with pytest.raises(ConfigError, match="--quantized-dense-memory is a CPU option"):
        ShardConfig(model_path="m", uds_path="s", device="cuda", quantized_dense_memory=2**20)  # type: ignore[arg-type]
    assert 0 < dense_copies.auto_budget(ranks_on_node=2) < dense_copies.available_memory()


def test_auto_stays_within_a_containers_memory_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "memory.current").write_text(f"{2**30}\n")
    monkeypatch.setattr(dense_copies, "_CGROUP_DIR", tmp_path)
    unlimited = dense_copies.available_memory()
    assert unlimited > 0
    (tmp_path / "memory.max").write_text(f"{3 * 2**30}\n")
    assert dense_copies.available_memory() == min(unlimited, 2 * 2**30)
    assert dense_copies.auto_budget(ranks_on_node=2) == min(unlimited, 2 * 2**30) // 4
