"""Quantized checkpoints load without the float storage of the weights they hold quantized: those parameters stay on
meta until quantization replaces them, while everything else holds what a model built on the device holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fp8_testing import write_fp8_checkpoint
from gguf_testing import write_tiny_llama_gguf
from int4_testing import awq_config, gptq_config, write_int4_checkpoint
from shard_testing import write_tiny_llama
from tandem_launcher.embedded import convert_gguf
from tandem_server.distributed import ParallelContext
from tandem_server.layers.attention import TorchAttentionBackend
from tandem_server.layers.linear import StackedColumns
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.loader import load_model
from tandem_server.models.registry import CausalLM
from tandem_server.quant.mode import QuantizeMode
from tandem_server.quant.quantize import KEPT_VALUES, quantize_model

CPU = torch.device("cpu")
# AutoFP8 keeps the ignored k_proj float: its q/k/v stack mixes float8 and float parts.
MIXED_STACK_IGNORED = ("model.layers.0.self_attn.k_proj",)
QUANTIZED = ("fp8-channel", "fp8-block", "fp8-mixed-stack", "gptq-act-order", "awq-g32", "gguf-q4_0")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A float tiny Llama and each quantized form of it (GGUF: a tiny Llama converted from a GGUF file)."""
    root = tmp_path_factory.mktemp("quantized-loading")
    write_tiny_llama(root / "float", tie_word_embeddings=False)
    write_fp8_checkpoint(root / "float", root / "fp8-channel", "compressed-tensors-channel")
    write_fp8_checkpoint(root / "float", root / "fp8-block", "block")
    write_fp8_checkpoint(root / "float", root / "fp8-mixed-stack", "autofp8", ignored=MIXED_STACK_IGNORED)
    write_int4_checkpoint(root / "float", root / "gptq-act-order", {**gptq_config(32), "desc_act": True})
    write_int4_checkpoint(root / "float", root / "awq-g32", awq_config(32))
    write_tiny_llama_gguf(root / "tiny.gguf", "Q4_0")
    convert_gguf(root / "tiny.gguf", root / "gguf-q4_0")
    return root


def _load(path: Path, gguf_blocks: bool) -> CausalLM:
    checkpoint = read_checkpoint_config(path)
    return load_model(
        checkpoint, torch.float32, CPU, ParallelContext(), TorchAttentionBackend(), gguf_blocks=gguf_blocks
    )


def _keeps_values(param: torch.Tensor) -> bool:
    return any(hasattr(param, attribute) for attribute in KEPT_VALUES)


def _views_into(part: torch.Tensor, stack: torch.Tensor) -> bool:
    start = stack.untyped_storage().data_ptr()
    return part.untyped_storage().data_ptr() == start and part.numel() > 0


@pytest.mark.parametrize("name", QUANTIZED)
def test_weights_held_quantized_get_no_float_storage_before_quantization(checkpoints: Path, name: str) -> None:
    model = _load(checkpoints / name, gguf_blocks=name.startswith("gguf"))
    params = dict(model.named_parameters())
    kept = {key for key, param in params.items() if _keeps_values(param)}
    assert kept, "the checkpoint holds some weights quantized"
    stacks = [module for module in model.modules() if isinstance(module, StackedColumns)]
    # A stack mixing quantized and float parts is stored whole: its GEMM dequantizes the quantized rows into it.
    mixed = {id(part) for stack in stacks if not stack.weight.is_meta for part in stack.weight_parts()}
    assert all(params[key].is_meta for key in kept if id(params[key]) not in mixed)
    assert not any(param.is_meta for key, param in params.items() if key not in kept)
    for stack in stacks:
        if all(_keeps_values(part) for part in stack.weight_parts()):
            assert stack.weight.is_meta
        else:
            assert all(_views_into(part, stack.weight) for part in stack.weight_parts())
        if stack.bias is not None:
            assert all(_views_into(layer.bias, stack.bias) for layer in stack.layers)
    if name == "fp8-mixed-stack":
        assert len(mixed) == 3


@pytest.mark.parametrize("name", QUANTIZED)
def test_computed_buffers_hold_the_values_a_float_build_computes(checkpoints: Path, name: str) -> None:
    model = _load(checkpoints / name, gguf_blocks=name.startswith("gguf"))
    float_model = _load(checkpoints / name if name.startswith("gguf") else checkpoints / "float", gguf_blocks=False)
    expected = dict(float_model.named_buffers())
    computed = {key: buffer for key, buffer in model.named_buffers() if key.endswith((".cos", ".sin"))}
    assert computed
    for key, buffer in computed.items():
        assert torch.equal(buffer, expected[key]), key


def test_a_stack_mixing_float8_and_float_parts_serves_every_parts_values(checkpoints: Path) -> None:
    path = checkpoints / "fp8-mixed-stack"
    values = write_fp8_checkpoint(checkpoints / "float", path, "autofp8", ignored=MIXED_STACK_IGNORED)
    model = _load(path, gguf_blocks=False)
    quantize_model(model, QuantizeMode.NONE)
    stack = next(module for module in model.modules() if isinstance(module, StackedColumns))
    names = ("q_proj", "k_proj", "v_proj")
    expected = torch.cat([values[f"model.layers.0.self_attn.{part}.weight"] for part in names])
    assert stack.weight_format.quantized is None
    assert torch.equal(stack.weight, expected)


def test_blocks_no_kernel_takes_are_dequantized_into_storage_given_at_quantization(checkpoints: Path) -> None:
    # With --quantize none nothing takes the GEMMs' blocks: every stack and layer built on meta gets storage then.
    model = _load(checkpoints / "gguf-q4_0", gguf_blocks=True)
    quantize_model(model, QuantizeMode.NONE)
    float_model = _load(checkpoints / "gguf-q4_0", gguf_blocks=False)
    expected = dict(float_model.named_parameters())
    for stack in (module for module in model.modules() if isinstance(module, StackedColumns)):
        assert not stack.weight.is_meta
        assert all(_views_into(part, stack.weight) for part in stack.weight_parts())
    for key, param in model.named_parameters():
        if param.numel():
            assert torch.equal(param, expected[key]), key
