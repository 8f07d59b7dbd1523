"""Weight preparation: named steps in dependency order, and one format per linear layer once they have run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from shard_testing import load_tiny_model, write_tiny_llama
from tandem_server.layers.gemm import GemmModule
from tandem_server.models.registry import CausalLM
from tandem_server.quant import dense_copies
from tandem_server.quant.dense_copies import DenseCopyFormat
from tandem_server.quant.format import DenseFormat
from tandem_server.quant.int8.weight import Int8Weight
from tandem_server.quant.mode import QuantizeMode
from tandem_server.quant.packed import PackedFormat, packing_available
from tandem_server.quant.pipeline import STEPS, WeightPreparation, prepare_weights

CPU = torch.device("cpu")


def _preparation(mode: QuantizeMode, dense_copy_memory: int | None, packed_rows: tuple[int, ...]) -> WeightPreparation:
    return WeightPreparation(mode, dense_copy_memory, 1, packed_rows, CPU, torch.float32)


def _formats(model: CausalLM) -> set[type]:
    return {type(module.weight_format) for module in model.modules() if isinstance(module, GemmModule)}


def test_the_steps_quantize_then_copy_then_pack() -> None:
    # Dense copies read the quantized formats; packing takes only the layers still dense.
    assert [step.name for step in STEPS] == ["quantize", "dense copies", "pack"]


def test_a_linear_layer_starts_dense_and_multiplies_by_its_weight() -> None:
    layer = GemmModule()
    layer.weight = torch.randn(8, 16)
    x, bias = torch.randn(3, 16), torch.randn(8)
    assert isinstance(layer.weight_format, DenseFormat) and layer.weight_format.name == "float32"
    assert torch.equal(layer.gemm(x, bias), F.linear(x, layer.weight, bias))


@pytest.mark.skipif(packing_available(CPU, torch.float32) is not None, reason="this torch build cannot prepack GEMMs")
def test_float_weights_are_packed_and_reported_as_float(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path, tie_word_embeddings=False)
    model = load_tiny_model(tmp_path)
    report = prepare_weights(model, _preparation(QuantizeMode.NONE, None, (32,)))
    assert _formats(model) == {PackedFormat}
    assert report.formats == {
        "qkv_proj: float32": 2, "o_proj: float32": 2, "gate_up_proj: float32": 2, "down_proj: float32": 2,
        "lm_head: float32": 1, "embed_tokens: float32": 1,
    }  # fmt: skip


@pytest.mark.skipif(dense_copies.unavailable_reason(auto=False) is not None, reason="no oneDNN bfloat16 kernels here")
def test_quantized_weights_get_copies_and_are_never_packed(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path, tie_word_embeddings=False)
    model = load_tiny_model(tmp_path)
    report = prepare_weights(model, _preparation(QuantizeMode.INT8, 2**30, (32,)))
    assert _formats(model) == {DenseCopyFormat}
    assert report.formats["dense copies: bfloat16 for batches of 6+ rows"] == 9
    assert all(
        isinstance(module.weight_format.quantized, Int8Weight)
        for module in model.modules()
        if isinstance(module, GemmModule)
    )
