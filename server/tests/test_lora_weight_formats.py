"""LoRA deltas on top of any weight format: over int8 and int4 GEMMs, a changed module's output is the quantized base
GEMM's plus exactly the adapter's scaled delta on the adapter rows, and the base GEMM's alone on the other rows; and
on CUDA the adapters' device slots come out of the KV cache's budget."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from fake_cuda import FakeCuda
from lora_testing import AdapterSpec, tensor_prefix, write_adapter
from safetensors.torch import load_file
from shard_testing import CPU, load_tiny_model, write_tiny_llama
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.engine.step import WarmupPlan
from tandem_server.layers.attention import SdpaAttentionBackend
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


def test_on_cuda_the_kv_cache_budget_leaves_room_for_every_lora_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tiny_llama(tmp_path)
    models = [load_tiny_model(tmp_path, backend=SdpaAttentionBackend()) for _ in range(2)]
    FakeCuda(free_bytes=64 * 1024 * 1024).install(monkeypatch)
    device = torch.device("cuda", 0)
    plan = WarmupPlan(block_size=4, max_batch_tokens=16, max_batch_requests=2)
    blocks, slot_bytes = [], []
    for model, max_loras in zip(models, (0, 4), strict=True):
        options = ExecutionOptions(cuda_memory_fraction=0.5, lora=LoraLimits(max_loras=max_loras, max_rank=16))
        runner = ModelRunner(model, (2,), torch.float32, device, options=options)
        # On a worker thread, as the model thread runs it: the fake places that thread's CUDA tensors on the CPU.
        with ThreadPoolExecutor(max_workers=1) as worker:
            blocks.append(worker.submit(runner.warmup, plan).result().num_blocks)
        slot_bytes.append(runner.lora.device_bytes)
    # Per layer: q/k/v (64, 32, 32 rows of 64 inputs) at 3 x 16, o (64 x 64) at 16, gate/up (2 x 128 of 64) at 2 x 16,
    # down (64 of 128) at 16; float32, 4 slots.
    per_layer = 48 * (64 + 128) + 16 * (64 + 64) + 32 * (64 + 256) + 16 * (128 + 64)
    assert slot_bytes == [0, 2 * per_layer * 4 * 4]
    bytes_per_block = 2 * 2 * 4 * 2 * 16 * 4  # K and V, 2 layers, 4 tokens, 2 heads of 16, float32
    assert blocks[0] - blocks[1] == pytest.approx(slot_bytes[1] / bytes_per_block, abs=1)
