"""LoRA deltas on top of any weight format: over int8 and int4 GEMMs, a changed module's output is the quantized base
GEMM's plus exactly the adapter's scaled delta on the adapter rows, and the base GEMM's alone on the other rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lora_testing import AdapterSpec, tensor_prefix, write_adapter
from safetensors.torch import load_file
from shard_testing import CPU, load_tiny_model, write_tiny_llama
from tandem_server.layers.gemm import GemmModule
from tandem_server.lora import LoraLimits, LoraRegistry
from tandem_server.quant.format import DenseFormat
from tandem_server.quant.mode import QuantizeMode
from tandem_server.quant.quantize import quantize_model

SPEC = AdapterSpec(rank=8, alpha=16, targets=("k_proj", "o_proj", "up_proj"), seed=6)
# The fused modules and the projections stacked in each, in order.
STACKS = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "mlp.gate_up_proj": ("gate_proj", "up_proj")}


def expected_delta(tensors: dict[str, torch.Tensor], path: str, x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """The merged-weight view of the adapter's change to module `model.layers.N.<group>.<name>` for input `x`."""
    layer, module = int(path.split(".")[2]), path.split(".", 3)[3]
    parts = STACKS.get(module, (module.rsplit(".", 1)[1],))
    deltas = []
    for name, size in zip(parts, sizes, strict=True):
        if name not in SPEC.targets:
            deltas.append(torch.zeros(x.shape[0], size))
            continue
        prefix = tensor_prefix(layer, name)
        a, b = tensors[f"{prefix}.lora_A.weight"], tensors[f"{prefix}.lora_B.weight"]
        deltas.append(SPEC.scaling * (x @ a.T) @ b.T)
    return torch.cat(deltas, dim=1)


@pytest.mark.parametrize("mode", [QuantizeMode.INT8, QuantizeMode.INT4])
@torch.inference_mode()
def test_the_delta_follows_a_quantized_gemm_on_adapter_rows_only(mode: QuantizeMode, tmp_path: Path) -> None:
    reference = write_tiny_llama(tmp_path / "model")
    model = load_tiny_model(tmp_path / "model")
    quantize_model(model, mode)
    registry = LoraRegistry(model, LoraLimits(), torch.float32, CPU)
    registry.load("adapter", write_adapter(tmp_path / "adapter", reference, SPEC))
    tensors = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    # Rows 0-2 run under the adapter, rows 3-4 the base model.
    step = registry.step(["adapter", ""], [3, 2], CPU)
    assert step is not None
    paths = {id(module): path for path, module in model.named_modules()}
    changed = {paths[id(module)] for module, _ in step.changes}
    modules = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj")
    assert changed == {f"model.layers.{layer}.{module}" for layer in range(2) for module in modules}
    for module, _ in step.changes:
        own_format = module.weight_format
        assert isinstance(module, GemmModule) and not isinstance(own_format, DenseFormat)
        # Every changed module of the tiny model reads 64 features (hidden size, and 4 heads of 16).
        x = torch.randn(5, 64)
        base = module.gemm(x, None)
        with step.applied():
            adapted = module.gemm(x, None)
        assert module.weight_format is own_format
        sizes = getattr(module, "sizes", [base.shape[1]])
        delta = expected_delta(tensors, paths[id(module)], x[:3], sizes)
        torch.testing.assert_close(adapted[:3] - base[:3], delta, rtol=1e-4, atol=1e-4)
        assert torch.equal(adapted[3:], base[3:])
