"""How many `torch._scaled_mm` calls a block-wise float8 linear takes on CUDA, and what they are given: one per
forward whatever the inputs, with 128 x 128 block scales on capability 9.x and one scale per row on 8.9, 10.x and
12.x. A CPU stand-in for `_scaled_mm` checks each call's operands as torch 2.15's CUDA `_scaled_mm` does for the
recipe (its meta registration and cuBLASLt's block-scale layout) and multiplies in float32, so the products are also
checked against the checkpoint's dequantized weights."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from fp8_testing import rounded_like_fp8
from tandem_server.quant.fp8.blocks import requantize_rows
from tandem_server.quant.fp8.weight import Fp8Recipe, Fp8Weight, fp8_recipe
from tandem_server.quant.values import FP8_DTYPE, FP8_MAX, Fp8Channels

CUDA = torch.device("cuda", 0)
BLOCK = 128
# 2.5 blocks of rows: the last block of rows is partial, as DeepSeek-V3's 576-row kv_a_proj_with_mqa.
OUT_FEATURES = 320
# The GEMM writes bfloat16: 8 significant bits.
BF16_RELATIVE = 2**-8
# Half a float8 e4m3 step: 3 mantissa bits; below the normal range, half of a subnormal step (2^-9 of the scale).
FP8_HALF_STEP = 2**-4
FP8_HALF_SUBNORMAL = 2**-10


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_operands(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None) -> None:
    """What CUDA's `_scaled_mm` demands of the matrices whatever the scales (torch/_meta_registrations.py)."""
    assert a.dtype == b.dtype == FP8_DTYPE and a.dim() == b.dim() == 2
    assert a.stride(0) > a.stride(1) == 1, f"a must be row-major, has strides {a.stride()}"
    assert b.stride(1) > b.stride(0) == 1, f"b must be column-major, has strides {b.stride()}"
    assert a.shape[1] == b.shape[0] and a.shape[1] % 16 == 0 and b.shape[1] % 16 == 0
    # The row-wise kernel writes bfloat16 or float16 only; Tandem asks for bfloat16.
    assert out_dtype == torch.bfloat16


def _block_wise_scales(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checks (1 x 128, 128 x 128) scales as ScaledBlas.cpp's `is_blockwise_1x128_scaling` and
    `is_blockwise_128x128_scaling` do, and cuBLASLt's 16-byte stride of block scales; returns them widened."""
    (m, k), n = a.shape, b.shape[1]
    blocks = _ceil_div(k, BLOCK)
    assert scale_a.dtype == scale_b.dtype == torch.float32
    assert scale_a.shape == (m, blocks), f"scale_a {tuple(scale_a.shape)}, expected {(m, blocks)}"
    # Outer-dim-major; a stride along a dimension of size 1 is not read.
    assert m == 1 or scale_a.stride(0) == 1, f"scale_a strides {scale_a.stride()}"
    assert blocks == 1 or scale_a.stride(1) == m, f"scale_a strides {scale_a.stride()}"
    assert scale_b.shape == (blocks, _ceil_div(n, BLOCK)), f"scale_b {tuple(scale_b.shape)}"
    assert blocks == 1 or scale_b.stride(0) == 1, f"scale_b strides {scale_b.stride()}"
    assert scale_b.shape[1] == 1 or scale_b.stride(1) == blocks, f"scale_b strides {scale_b.stride()}"
    assert blocks % 4 == 0, f"{blocks} blocks of inputs: cuBLASLt reads the block scales at a stride of 4"
    widened_a = scale_a.repeat_interleave(BLOCK, dim=1)[:, :k]
    widened_b = scale_b.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)[:k, :n]
    return widened_a, widened_b


def _row_wise_scales(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    assert scale_a.dtype == scale_b.dtype == torch.float32
    assert scale_a.shape == (a.shape[0], 1) and scale_b.shape == (1, b.shape[1])
    assert scale_a.is_contiguous() and scale_b.is_contiguous()
    return scale_a, scale_b


@dataclass
class ScaledMmStandIn:
    """`torch._scaled_mm` on CUDA for `recipe`, run on the CPU in float32; counts its calls."""

    recipe: Fp8Recipe
    calls: int = 0

    def __call__(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        scale_a: torch.Tensor,
        scale_b: torch.Tensor,
        out_dtype: torch.dtype | None = None,
        **unused: object,
    ) -> torch.Tensor:
        self.calls += 1
        assert not unused, f"unexpected arguments {sorted(unused)}"
        _check_operands(a, b, out_dtype)
        scales = _block_wise_scales if self.recipe is Fp8Recipe.BLOCK_WISE else _row_wise_scales
        widened_a, widened_b = scales(a, b, scale_a, scale_b)
        return ((a.float() * widened_a) @ (b.float() * widened_b)).to(out_dtype)


def _block_weight(in_features: int, first_row: int = 0) -> Fp8Channels:
    """A block-wise checkpoint's weight as the loader hands it over: 128 x 128 block scales widened to rows, from
    row `first_row` of the checkpoint's weight on (a rank's slice)."""
    generator = torch.Generator().manual_seed(in_features)
    rows = first_row + OUT_FEATURES
    q = (torch.randn(rows, in_features, generator=generator) * 100).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    # Scales spanning three orders of magnitude, so a block's own scale matters.
    blocks = 10 ** (-3 * torch.rand(_ceil_div(rows, BLOCK), in_features // BLOCK, generator=generator))
    scale = blocks.repeat_interleave(BLOCK, dim=0)[first_row:rows]
    return Fp8Channels(q[first_row:].contiguous(), scale.contiguous(), input_group=BLOCK)


def _cuda_weight(channels: Fp8Channels, capability: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> Fp8Weight:
    """The weight as load lays it out for a CUDA GPU of `capability` (its tensors stay on the CPU)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.version, "cuda", "12.9")
    return Fp8Weight(channels, fp8_recipe(CUDA))


def _calls_per_forward(weight: Fp8Weight, stand_in: ScaledMmStandIn, x: torch.Tensor) -> tuple[int, torch.Tensor]:
    stand_in.calls = 0
    out = weight.linear(x, None)
    return stand_in.calls, out


CASES = {
    "sm90, 4 blocks of inputs": ((9, 0), 512, Fp8Recipe.BLOCK_WISE),
    "sm90, 16 blocks of inputs": ((9, 0), 2048, Fp8Recipe.BLOCK_WISE),
    # 2 blocks of inputs: cuBLASLt would read the block scales at a stride of 4, `_scaled_mm` gives 2.
    "sm90, 2 blocks of inputs": ((9, 0), 256, Fp8Recipe.ROW_WISE),
    "sm89, 2 blocks of inputs": ((8, 9), 256, Fp8Recipe.ROW_WISE),
    "sm89, 8 blocks of inputs": ((8, 9), 1024, Fp8Recipe.ROW_WISE),
    "sm100": ((10, 0), 1024, Fp8Recipe.ROW_WISE),
    "sm120": ((12, 0), 1024, Fp8Recipe.ROW_WISE),
}


@pytest.mark.parametrize("case", CASES)
def test_a_block_wise_linear_on_cuda_is_one_scaled_mm_whatever_its_inputs(
    monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    capability, in_features, recipe = CASES[case]
    channels = _block_weight(in_features)
    weight = _cuda_weight(channels, capability, monkeypatch)
    assert weight.recipe is recipe
    stand_in = ScaledMmStandIn(recipe)
    monkeypatch.setattr(torch, "_scaled_mm", stand_in)
    reference = channels.dequantize()
    for rows in (1, 5):
        x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows)) * 3
        calls, out = _calls_per_forward(weight, stand_in, x)
        assert calls == 1, f"{calls} _scaled_mm calls for one forward of {in_features} inputs"
        # Block-wise: activations rounded per token and 128 inputs, the weight exact; only bfloat16 output rounding
        # (and float32 summation order) differ.
        rounded = rounded_like_fp8(x, BLOCK if recipe is Fp8Recipe.BLOCK_WISE else None)
        expected = F.linear(rounded, reference)
        bound = BF16_RELATIVE * expected.abs() + 1e-5 * F.linear(rounded.abs(), reference.abs())
        if recipe is Fp8Recipe.ROW_WISE:
            # Row-wise: activations rounded per token; the weight rounded again per row, within half a float8 step.
            row_scale = reference.abs().amax(-1, keepdim=True) / FP8_MAX
            step = reference.abs() * FP8_HALF_STEP + row_scale * FP8_HALF_SUBNORMAL
            bound = bound + F.linear(rounded.abs(), step)
        assert ((out - expected).abs() <= bound).all(), f"largest error {(out - expected).abs().max():.3g}"


def test_hopper_falls_back_to_row_scales_when_a_ranks_rows_start_inside_a_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    channels = _block_weight(1024, first_row=64)
    weight = _cuda_weight(channels, (9, 0), monkeypatch)
    assert weight.recipe is Fp8Recipe.ROW_WISE
    aligned = _cuda_weight(_block_weight(1024), (9, 0), monkeypatch)
    assert aligned.recipe is Fp8Recipe.BLOCK_WISE
    stand_in = ScaledMmStandIn(Fp8Recipe.ROW_WISE)
    monkeypatch.setattr(torch, "_scaled_mm", stand_in)
    calls, _ = _calls_per_forward(weight, stand_in, torch.randn(3, 1024))
    assert calls == 1


def test_a_block_scaled_weight_serves_its_rows_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    channels = _block_weight(512)
    weight = _cuda_weight(channels, (9, 0), monkeypatch)
    assert weight.recipe is Fp8Recipe.BLOCK_WISE
    ids = torch.tensor([[0, 319], [128, 255]])
    assert torch.equal(weight.rows(ids, torch.float32), channels.dequantize()[ids])


@pytest.mark.parametrize(
    ("capability", "cuda", "recipe"),
    [
        ((9, 0), "12.9", Fp8Recipe.BLOCK_WISE),
        ((9, 0), "13.2", Fp8Recipe.BLOCK_WISE),
        # cuBLASLt's block-scaled GEMM came with CUDA 12.9.
        ((9, 0), "12.8", Fp8Recipe.ROW_WISE),
        ((8, 9), "13.2", Fp8Recipe.ROW_WISE),
        ((10, 0), "13.2", Fp8Recipe.ROW_WISE),
        ((12, 0), "13.2", Fp8Recipe.ROW_WISE),
    ],
)
def test_the_recipe_follows_the_gpu_and_cuda_version(
    monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], cuda: str, recipe: Fp8Recipe
) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    assert fp8_recipe(CUDA) is recipe
    assert fp8_recipe(torch.device("cpu")) is Fp8Recipe.RUNS


def test_the_cpu_keeps_one_scaled_mm_per_run_of_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    cpu_scaled_mm = torch._scaled_mm

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return cpu_scaled_mm(*args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", counted)
    weight = Fp8Weight(_block_weight(512))
    assert weight.recipe is Fp8Recipe.RUNS
    weight.linear(torch.randn(2, 512), None)
    assert len(calls) == 512 // BLOCK


def test_requantizing_block_scales_per_row_stays_within_half_a_float8_step() -> None:
    # 1040 rows: two slabs of requantization.
    generator = torch.Generator().manual_seed(0)
    q = (torch.randn(1040, 256, generator=generator) * 100).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    blocks = 10 ** (-3 * torch.rand(9, 2, generator=generator))
    channels = Fp8Channels(q, blocks.repeat_interleave(BLOCK, dim=0)[:1040], input_group=BLOCK)
    original = channels.dequantize()
    rows = requantize_rows(channels)
    assert rows.input_group is None and rows.scale.shape == (1040,) and rows.q.dtype == FP8_DTYPE
    step = original.abs() * FP8_HALF_STEP + rows.scale.unsqueeze(-1) * FP8_HALF_SUBNORMAL
    assert ((rows.dequantize() - original).abs() <= step).all()
    # Each row's largest magnitude is a float8 value at the top of the range.
    torch.testing.assert_close(rows.scale, original.abs().amax(-1) / FP8_MAX)
