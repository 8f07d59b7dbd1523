"""Quantized GEMM weights: GGUF blocks decoded as llama.cpp does, torch's int4/int8 kernels against the float
weights they stand for, and tiny models converted from GGUF files served quantized against their float conversion."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from gguf_testing import write_tiny_llama_gguf
from reference_checks import BLOCK_SIZE, SCHEDULE, SEQUENCE_LENGTHS
from safetensors import safe_open
from shard_testing import load_tiny_model, write_tiny_llama
from tandem_launcher.config import DEFAULT_MODEL_CACHE_DIR
from tandem_launcher.embedded import convert_gguf, converted_model_dir, embedded_gguf
from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.execution.batch import ScheduledSpan, build_step_batch
from tandem_server.execution.eager import forward_step
from tandem_server.execution.kv_cache import CacheGeometry, KVCache
from tandem_server.layers.attention import TorchAttentionBackend
from tandem_server.layers.embedding import LMHead
from tandem_server.layers.gemm import GemmModule
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.loader import load_model
from tandem_server.models.registry import CausalLM
from tandem_server.quant.checks import check_quantization
from tandem_server.quant.gguf.blocks import GgufBlocks, read_blocks
from tandem_server.quant.int4.cpu_layout import packed_block
from tandem_server.quant.int4.weight import DENSE_MIN_ROWS, Int4Weight
from tandem_server.quant.int8.weight import Int8GroupsWeight, Int8Weight
from tandem_server.quant.kernels import kernels_unavailable_reason, quantized_weight
from tandem_server.quant.mode import QuantizeMode
from tandem_server.quant.quantize import QuantizationReport, quantize_model
from tandem_server.quant.values import Int4Groups, Int8Groups, quantize_int4, quantize_int8
from tandem_server.weights.gguf_format import GGUF_BLOCKS_DIR, GGUF_TYPES_KEY
from tandem_server.weights.slicing import CheckpointSlice, CheckpointTensor

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(
    kernels_unavailable_reason(CPU, QuantizeMode.INT4) is not None, reason="no CPU weight-only kernels"
)
# bfloat16 activations carry 8 significant bits: a dot product's error stays within a few parts in 2^8 of the sum of
# its terms' magnitudes (measured here: under 2^-8 for every layer shape of the tiny and embedded models).
BFLOAT16_RELATIVE = 2**-6


def _random_weight(rows: int, columns: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, columns)).astype(np.float32)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_blocks_dequantize_to_llama_cpps_values(kind: str) -> None:
    raw = quantize(_random_weight(48, 96), GGMLQuantizationType[kind])
    expected = torch.from_numpy(dequantize(raw, GGMLQuantizationType[kind]))
    blocks = GgufBlocks(kind, torch.from_numpy(raw))
    assert blocks.in_features == 96
    assert torch.equal(blocks.dequantize(), expected)
    if kind != "Q8_0":  # int4 groups hold the same values, rewritten as (q - 8) * scale + zero
        torch.testing.assert_close(blocks.unpack().dequantize(), expected, rtol=1e-6, atol=1e-7)


def test_q8_0_blocks_are_served_as_two_int4_planes_that_sum_to_their_values() -> None:
    raw = quantize(_random_weight(64, 96), GGMLQuantizationType.Q8_0)
    exact = torch.from_numpy(dequantize(raw, GGMLQuantizationType.Q8_0))
    groups = GgufBlocks("Q8_0", torch.from_numpy(raw)).unpack()
    assert isinstance(groups, Int8Groups) and torch.equal(groups.dequantize(), exact)
    high, low = groups.nibble_planes()
    torch.testing.assert_close(high.dequantize() + low.dequantize(), exact, rtol=1e-6, atol=1e-7)
    weight = quantized_weight(groups)
    assert isinstance(weight, Int8GroupsWeight)
    # Scales rounded to bfloat16 (8 significant bits) move each value by at most 2^-8 of itself.
    assert ((weight.high.dequantize() + weight.low.dequantize() - exact).abs() <= exact.abs() * 2**-8 + 1e-7).all()
    x = torch.randn(3, 96)
    _assert_bfloat16_close(weight.linear(x, None), x, exact)
    ids = torch.tensor([[63, 0], [31, 32]])
    rows = weight.rows(ids, torch.float32)
    assert rows.shape == (2, 2, 96)
    torch.testing.assert_close(rows, (weight.high.dequantize() + weight.low.dequantize())[ids])


def test_float_weights_quantize_within_half_a_step() -> None:
    weight = torch.from_numpy(_random_weight(24, 64))
    groups = quantize_int4(weight)
    assert int(groups.q.min()) >= 0 and int(groups.q.max()) <= 15
    step = groups.scale.repeat_interleave(32, dim=1)
    assert ((groups.dequantize() - weight).abs() <= step / 2 + 1e-6).all()
    channels = quantize_int8(weight)
    assert ((channels.dequantize() - weight).abs() <= channels.scale.unsqueeze(-1) / 2 + 1e-6).all()
    with pytest.raises(ValueError, match="multiples of 32"):
        quantize_int4(weight[:, :48])


def _assert_bfloat16_close(actual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    expected = F.linear(x, weight)
    magnitude = F.linear(x.abs(), weight.abs())
    assert ((actual - expected).abs() <= BFLOAT16_RELATIVE * magnitude + 1e-5).all()


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_int4_kernel_multiplies_by_the_blocks_values(kind: str) -> None:
    raw = quantize(_random_weight(96, 128), GGMLQuantizationType[kind])
    blocks = GgufBlocks(kind, torch.from_numpy(raw))
    x = torch.randn(5, 128)
    kernel = Int4Weight(blocks.unpack())  # type: ignore[arg-type]
    _assert_bfloat16_close(kernel.linear(x, None), x, blocks.dequantize())


def test_the_packed_int4_weight_unpacks_to_its_groups_values() -> None:
    assert packed_block() is not None
    groups = quantize_int4(torch.from_numpy(_random_weight(96, 64)))
    kernel = Int4Weight(groups)
    assert kernel.unpackable
    # The kernel's scales and zeros are bfloat16; the unpacked weight uses exactly those.
    rounded = Int4Groups(groups.q, groups.scale.bfloat16().float(), groups.zero.bfloat16().float())
    torch.testing.assert_close(kernel.dequantize(), rounded.dequantize(), rtol=1e-6, atol=1e-6)


def test_a_prefill_sized_gemm_multiplies_densely_by_the_same_values() -> None:
    groups = quantize_int4(torch.from_numpy(_random_weight(64, 96)))
    kernel = Int4Weight(groups)
    x = torch.randn(DENSE_MIN_ROWS, 96)
    dense = kernel.linear(x, None)
    torch.testing.assert_close(dense, F.linear(x, kernel.dequantize()))
    _assert_bfloat16_close(dense, x, groups.dequantize())
    through_kernel = torch.cat([kernel.linear(x[start : start + 64], None) for start in range(0, DENSE_MIN_ROWS, 64)])
    _assert_bfloat16_close(through_kernel, x, kernel.dequantize())


def test_int8_kernel_multiplies_by_its_values_and_looks_rows_up() -> None:
    weight = torch.from_numpy(_random_weight(80, 64))
    channels = quantize_int8(weight)
    kernel = Int8Weight(channels)
    x = torch.randn(3, 64)
    _assert_bfloat16_close(kernel.linear(x, None), x, channels.dequantize())
    ids = torch.tensor([0, 79, 5])
    assert torch.equal(kernel.rows(ids, torch.float32), channels.dequantize()[ids])


def test_a_row_gets_the_same_numbers_alone_or_in_a_batch() -> None:
    """Determinism across batch shapes: a request's logits may not depend on who shares its step."""
    kernel = Int4Weight(quantize_int4(torch.from_numpy(_random_weight(64, 96))))
    x = torch.randn(9, 96)
    batched = kernel.linear(x, None)
    for row in (0, 4, 8):
        assert torch.equal(kernel.linear(x[row : row + 1], None)[0], batched[row])


def test_splitting_input_features_inside_a_block_is_refused() -> None:
    raw = torch.from_numpy(quantize(_random_weight(8, 64), GGMLQuantizationType.Q4_0))
    handle = {"t": raw}

    class Source:
        def get_shape(self) -> list[int]:
            return list(handle["t"].shape)

        def __getitem__(self, index: tuple[slice, ...]) -> torch.Tensor:
            return handle["t"][index]

    tensor = CheckpointTensor(Source())
    half = read_blocks(tensor, "Q4_0", CheckpointSlice(1, 32, 64))
    assert half.in_features == 32
    assert torch.equal(half.dequantize(), GgufBlocks("Q4_0", raw).dequantize()[:, 32:])
    with pytest.raises(ValueError, match="split a Q4_0 block"):
        read_blocks(tensor, "Q4_0", CheckpointSlice(1, 16, 64))


@pytest.fixture(scope="module", params=["Q4_0", "Q4_1"])
def converted_tiny_gguf(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama written as a GGUF with layer weights in the given type and a Q8_0 embedding, then converted."""
    directory = tmp_path_factory.mktemp(f"tiny-{request.param}")
    write_tiny_llama_gguf(directory / "tiny.gguf", request.param)
    convert_gguf(directory / "tiny.gguf", directory / "converted")
    return directory / "converted"


def test_the_conversion_keeps_every_quantized_tensor_as_blocks(converted_tiny_gguf: Path) -> None:
    with safe_open(str(converted_tiny_gguf / GGUF_BLOCKS_DIR / "model.safetensors"), framework="pt") as handle:
        types = json.loads(handle.metadata()[GGUF_TYPES_KEY])
        assert set(handle.keys()) == set(types)
    assert types.pop("model.embed_tokens.weight") == "Q8_0"
    assert len(types) == 2 * 7
    assert len(set(types.values())) == 1


def _load(path: Path, mode: QuantizeMode) -> tuple[CausalLM, QuantizationReport]:
    checkpoint = read_checkpoint_config(path)
    model = load_model(
        checkpoint,
        torch.float32,
        CPU,
        ParallelContext(),
        TorchAttentionBackend(),
        gguf_blocks=mode is QuantizeMode.GGUF,
    )
    return model, quantize_model(model, mode)


def _schedule_logits(model: CausalLM) -> torch.Tensor:
    """Every scheduled token's logits over the mixed prefill/decode SCHEDULE of reference_checks."""
    sequences = {name: [(7 * i + len(name)) % 120 + 3 for i in range(n)] for name, n in SEQUENCE_LENGTHS.items()}
    spec = model.spec
    cache = KVCache(
        CacheGeometry(spec.num_layers, BLOCK_SIZE, spec.num_kv_heads, spec.head_dim, torch.float32), 24, CPU
    )
    tables = {name: list(range(6 * i, 6 * i + 6)) for i, name in enumerate(SEQUENCE_LENGTHS)}
    logits = []
    with torch.inference_mode():
        for step in SCHEDULE:
            spans = [ScheduledSpan(sequences[n][s : s + k], s, tables[n]) for n, s, k in step]
            hidden = forward_step(model, build_step_batch(spans, BLOCK_SIZE, CPU), cache.layers)
            logits.append(model.compute_logits(hidden).float())
    return torch.cat(logits)


def test_a_tiny_gguf_served_quantized_matches_its_float_conversion(converted_tiny_gguf: Path) -> None:
    float_model, _ = _load(converted_tiny_gguf, QuantizeMode.NONE)
    quantized, report = _load(converted_tiny_gguf, QuantizeMode.GGUF)
    kind = next(f for f in report.formats if f.startswith("qkv_proj")).split(": ")[1]
    assert kind.endswith("as int4") and kind.startswith("Q4_")
    assert report.formats["lm_head: Q8_0 as int8 in groups of 32"] == 1
    assert report.formats["embed_tokens: int8 in groups of 32, shared with the tied LM head"] == 1
    expected, actual = _schedule_logits(float_model), _schedule_logits(quantized)
    # Measured on both types: the largest logit error is under 1% of the largest logit.
    assert (actual - expected).abs().max() <= 0.02 * expected.abs().max()
    assert (actual.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.9


def test_quantized_weights_take_little_more_than_the_gguf_tensors(converted_tiny_gguf: Path) -> None:
    gguf_bytes = (converted_tiny_gguf / GGUF_BLOCKS_DIR / "model.safetensors").stat().st_size
    _, report = _load(converted_tiny_gguf, QuantizeMode.GGUF)
    assert report.weight_bytes <= 1.3 * gguf_bytes
    _, float_report = _load(converted_tiny_gguf, QuantizeMode.NONE)
    assert float_report.weight_bytes > 4 * report.weight_bytes


def _rounded_like(model: CausalLM, mode: QuantizeMode) -> CausalLM:
    """`model` with every GEMM weight replaced in place by the float values `mode` rounds it to."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, GemmModule):
                int8 = mode is QuantizeMode.INT8 or isinstance(module, LMHead)
                rounded = quantize_int8(module.weight) if int8 else quantize_int4(module.weight)
                module.weight.copy_(rounded.dequantize())
    return model


@pytest.mark.parametrize("mode", [QuantizeMode.INT4, QuantizeMode.INT8])
def test_a_float_checkpoint_quantized_at_load_multiplies_by_its_rounded_weights(
    tmp_path: Path, mode: QuantizeMode
) -> None:
    write_tiny_llama(tmp_path, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
    expected = _schedule_logits(_rounded_like(load_tiny_model(tmp_path), mode))
    quantized, report = _load(tmp_path, mode)
    assert report.formats[f"down_proj: float as {mode.value}"] == 2
    assert report.formats["lm_head: float as int8"] == 1
    actual = _schedule_logits(quantized)
    assert (actual - expected).abs().max() <= 0.02 * expected.abs().max()


def test_gguf_mode_needs_a_model_that_kept_blocks(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path)
    with pytest.raises(ConfigError, match="keeps no GGUF blocks"):
        check_quantization(QuantizeMode.GGUF, read_checkpoint_config(tmp_path), CPU)


def test_quantizing_is_a_cpu_path() -> None:
    assert kernels_unavailable_reason(torch.device("cuda"), QuantizeMode.INT8) is not None


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="resident memory is read from /proc")
def test_the_embedded_gguf_served_quantized_takes_little_more_memory_than_its_tensors() -> None:
    model = converted_model_dir(embedded_gguf(), DEFAULT_MODEL_CACHE_DIR)
    gguf_tensor_bytes = sum(path.stat().st_size for path in (model / GGUF_BLOCKS_DIR).glob("*.safetensors"))
    script = Path(__file__).with_name("weights_rss.py")
    measured = subprocess.run(
        [sys.executable, str(script), str(model), "gguf"], capture_output=True, text=True, check=True, timeout=300
    )
    added = json.loads(measured.stdout.splitlines()[-1])["added"]
    # Measured: 105.7 MiB for 92.0 MiB of GGUF tensors (float32 weights: 513 MiB).
    assert added <= 1.3 * gguf_tensor_bytes, f"{added / 2**20:.1f} MiB for {gguf_tensor_bytes / 2**20:.1f} MiB"


def test_int8_groups_whose_rows_the_int4_kernel_cannot_take_are_kept_per_channel() -> None:
    def groups(rows: int) -> Int8Groups:
        generator = torch.Generator().manual_seed(rows)
        q = torch.randint(-127, 128, (rows, 64), dtype=torch.int8, generator=generator)
        return Int8Groups(q, torch.rand(rows, 2, generator=generator) / 100)

    assert isinstance(quantized_weight(groups(48)), Int8GroupsWeight)
    odd = groups(40)
    kept = quantized_weight(odd)
    assert isinstance(kept, Int8Weight)
    # Re-quantized per row: each value within half a step of the row's int8 scale.
    row_step = odd.dequantize().abs().amax(-1, keepdim=True) / 127
    assert ((kept.q.float() * kept.scale.unsqueeze(-1) - odd.dequantize()).abs() <= row_step / 2 + 1e-6).all()
