"""The int4 Triton GEMM against float32 references: run on CUDA, or on CPU by Triton's interpreter.

Not collected by default (no `test_` prefix): `test_int4_triton.py` runs it in a subprocess with TRITON_INTERPRET=1
(which must be set before Triton is first imported). The interpreter multiplies bfloat16 tiles as their raw 16-bit
patterns (Triton 3.9's `create_dot` hands them to numpy as integers), so under it bfloat16 dots are widened to
float32 first, which is what the GPU's bfloat16 tensor cores compute: exact products, float32 sums.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from int4_testing import awq_config, gptq_config, write_int4_checkpoint
from shard_testing import load_tiny_model, write_tiny_llama
from tandem_server.layers.gemm import GemmModule
from tandem_server.quant import quantize
from tandem_server.quant.int4 import triton_gemm
from tandem_server.quant.int4.checkpoint import INT4_VALUES
from tandem_server.quant.int4.weight import Int4TritonWeight, Int4Weight
from tandem_server.quant.kernels import QuantizedWeight
from tandem_server.quant.mode import QuantizeMode
from tandem_server.quant.quantize import quantize_model
from tandem_server.quant.values import Int4Groups
from tp_worker import prompt_logits
from triton_testing import widen_bfloat16_dots

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
ON_CUDA = torch.cuda.is_available() and not INTERPRETED
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")
# Unit roundoff: each weight is rounded to the activation dtype before the dot, and so is each output.
ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}

if not ON_CUDA and not INTERPRETED:
    pytest.skip("needs CUDA or TRITON_INTERPRET=1", allow_module_level=True)


if INTERPRETED:
    widen_bfloat16_dots()


def random_groups(out_features: int, in_features: int, group_size: int, act_order: bool, seed: int) -> Int4Groups:
    generator = torch.Generator().manual_seed(seed)
    groups = in_features // group_size
    q = torch.randint(0, 16, (out_features, in_features), generator=generator, dtype=torch.uint8)
    scale = torch.rand(out_features, groups, generator=generator) * 0.05 + 0.005
    zero = torch.randn(out_features, groups, generator=generator) * 0.1
    order = torch.randperm(in_features, generator=generator) if act_order else None
    return Int4Groups(q, scale, zero, group_size, order)


def rounded_reference(groups: Int4Groups, dtype: torch.dtype) -> torch.Tensor:
    """The float32 `[out, in]` weight the kernel multiplies by: scales and zeros in `dtype`, columns in input order."""
    rounded = Int4Groups(
        groups.q, groups.scale.to(dtype).float(), groups.zero.to(dtype).float(), groups.group_size, groups.input_order
    )
    return rounded.dequantize()


# (out, in, group): outputs that fill no whole tile of 64 or 128, one group over all inputs, inputs split across
# programs (split-K) at every row count.
SHAPES = [(40, 1024, 32), (96, 256, 64), (48, 512, 128), (136, 256, 256)]


def test_the_shapes_reach_split_and_whole_launches() -> None:
    splits = set()
    for out_features, in_features, group_size in SHAPES:
        config = triton_gemm.tile_config(1, group_size)
        output_tiles = -(-out_features // config.block_n)
        splits.add(triton_gemm.k_splits(output_tiles, in_features // config.block_k, triton_gemm.DEFAULT_SM_COUNT))
    assert 1 in splits and max(splits) > 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("act_order", [False, True], ids=["in-order", "act-order"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: "x".join(map(str, shape)))
@pytest.mark.parametrize("rows", [1, 3, 17, 64])
def test_kernel_multiplies_by_the_dequantized_weight(
    rows: int, shape: tuple[int, int, int], act_order: bool, dtype: torch.dtype
) -> None:
    out_features, in_features, group_size = shape
    groups = random_groups(out_features, in_features, group_size, act_order, seed=rows + in_features)
    weight = Int4TritonWeight(groups.to(DEVICE), dtype)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows)).to(dtype)
    bias = torch.randn(out_features).to(dtype)
    output = weight.linear(x.to(DEVICE), bias.to(DEVICE)).cpu()
    dense = rounded_reference(groups, dtype)
    product = x.float() @ dense.t()
    expected = product + bias.float()
    # Each weight and the product are rounded to `dtype`, then the sum with the bias: each by at most its roundoff.
    bound = ROUNDOFF[dtype] * (x.float().abs() @ dense.abs().t() + product.abs() + expected.abs()) + 1e-6
    assert output.dtype == dtype
    error = (output.float() - expected).abs()
    assert (error <= bound).all(), float(error.max())


def test_float32_activations_are_multiplied_in_bfloat16_and_returned_in_float32() -> None:
    groups = random_groups(32, 64, 32, act_order=False, seed=1)
    weight = Int4TritonWeight(groups.to(DEVICE), torch.float32)
    x = torch.randn(2, 64)
    output = weight.linear(x.to(DEVICE), None).cpu()
    expected = x.bfloat16().float() @ rounded_reference(groups, torch.bfloat16).t()
    assert output.dtype == torch.float32 and weight.scale.dtype == torch.bfloat16
    torch.testing.assert_close(output, expected, atol=2e-2 * float(expected.abs().max()), rtol=0)


CHECKPOINTS = {"gptq-act-order": {**gptq_config(32), "desc_act": True}, "awq-g64": awq_config(64)}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("int4-triton")
    write_tiny_llama(root / "float", tie_word_embeddings=False)
    for name, config in CHECKPOINTS.items():
        write_int4_checkpoint(root / "float", root / name, config)
    return root


@pytest.mark.skipif(ON_CUDA, reason="compares with torch's CPU kernel")
@pytest.mark.parametrize("name", CHECKPOINTS)
def test_each_checkpoint_layer_multiplies_like_the_cpu_kernel(checkpoints: Path, name: str) -> None:
    model = load_tiny_model(checkpoints / name)
    layers = {
        key: getattr(param, INT4_VALUES) for key, param in model.named_parameters() if hasattr(param, INT4_VALUES)
    }
    assert len(layers) == 14  # q, k, v, o, gate, up, down in each of two layers
    for key, groups in layers.items():
        x = torch.randn(5, groups.q.shape[1], generator=torch.Generator().manual_seed(len(key)))
        cpu = Int4Weight(groups).linear(x, None)
        triton = Int4TritonWeight(groups, torch.float32).linear(x, None)
        dense = rounded_reference(groups, torch.bfloat16)
        activations = x.bfloat16().float()
        # The CPU kernel rounds only its output; the Triton kernel each weight too (see the random cases).
        bound = ROUNDOFF[torch.bfloat16] * (activations.abs() @ dense.abs().t() + 2 * cpu.abs()) + 1e-6
        assert ((triton - cpu).abs() <= bound).all(), key


# Measured: 0.095 of logits up to 5.1 (GPTQ act-order), 0.075 of 4.6 (AWQ): one bfloat16 rounding of a GEMM output
# that differs (the Triton kernel also rounds each weight) grows through the tiny random model's layers.
SERVED_RELATIVE = 0.03


@pytest.mark.skipif(ON_CUDA, reason="compares with torch's CPU kernel")
@pytest.mark.parametrize("name", CHECKPOINTS)
def test_a_checkpoint_served_through_the_triton_weight_gives_the_cpu_logits(
    checkpoints: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The same checkpoint quantized for the Triton weight (as on CUDA) and for torch's CPU kernel."""
    cpu_model = load_tiny_model(checkpoints / name)
    quantize_model(cpu_model, QuantizeMode.NONE)
    expected = prompt_logits(cpu_model)

    def triton_weight(source: Int4Groups, dtype: torch.dtype) -> QuantizedWeight:
        return Int4TritonWeight(source, dtype)

    monkeypatch.setattr(quantize, "quantized_weight", triton_weight)
    model = load_tiny_model(checkpoints / name)
    quantize_model(model, QuantizeMode.NONE)
    kinds = {
        type(module.weight_format.quantized)
        for module in model.modules()
        if isinstance(module, GemmModule) and module.weight_format.quantized is not None
    }
    assert kinds == {Int4TritonWeight}
    logits = prompt_logits(model)
    assert (logits - expected).abs().max() <= SERVED_RELATIVE * expected.abs().max()
