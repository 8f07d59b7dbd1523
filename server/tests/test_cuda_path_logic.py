"""The CUDA path's host-side logic, checked on CPU: cache sizing, graph sizes and padding, rank devices, flags."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from attention_testing import BLOCK_SIZE, DECODE_STEP, HEAD_DIM, HEADS, KV_HEADS, NUM_BLOCKS, paged_case
from shard_testing import load_tiny_model, write_tiny_llama
from tandem_server.cli import config_from_args
from tandem_server.config import DEFAULT_CUDA_GRAPH_SIZES, ShardConfig, parse_cuda_graph_sizes
from tandem_server.distributed import rank_device
from tandem_server.engine.batch import ScheduledSpan, build_step_batch
from tandem_server.engine.cuda_graphs import DecodeBuffers, graph_batch_size
from tandem_server.engine.forward import forward_step
from tandem_server.engine.kv_cache import CacheGeometry, KVCache
from tandem_server.engine.timing import StepTimer
from tandem_server.engine.warmup import blocks_for_budget, cuda_cache_budget
from tandem_server.errors import CacheBudgetError, ConfigError
from tandem_server.layers.attention import (
    AttentionParams,
    LayerCache,
    SdpaAttentionBackend,
    StaticDecodeMetadata,
    TorchAttentionBackend,
    is_decode_only,
)

GIB = 1024**3
SHARD = ["--model-path", "m", "--uds-path", "s"]


def test_cuda_cache_budget_is_a_fraction_of_free_memory_less_the_profiled_step() -> None:
    # An H200 with an 8B bf16 model loaded: about 124 GiB free, a 512-token step peaking at 1.5 GiB.
    assert cuda_cache_budget(124 * GIB, 3 * GIB // 2, 0.9) == int(124 * GIB * 0.9) - 3 * GIB // 2
    # Llama-3-8B geometry: 32 layers x 8 kv heads x 128 dims, bf16, 16-token blocks = 2 MiB per block.
    geometry = CacheGeometry(32, 16, 8, 128, torch.bfloat16)
    assert geometry.bytes_per_block == 2 * 1024**2
    blocks = blocks_for_budget(
        geometry.bytes_per_block, cuda_cache_budget(124 * GIB, 3 * GIB // 2, 0.9), "--cuda-memory-fraction"
    )
    assert blocks == (int(124 * GIB * 0.9) - 3 * GIB // 2) // (2 * 1024**2) - 1


def test_captured_graphs_pool_is_set_aside_before_the_cache_is_sized() -> None:
    assert cuda_cache_budget(124 * GIB, GIB, 0.9, graph_bytes=GIB // 2) == int(124 * GIB * 0.9) - GIB - GIB // 2
    with pytest.raises(CacheBudgetError, match="capture fewer --cuda-graphs"):
        cuda_cache_budget(2 * GIB, GIB, 0.9, graph_bytes=GIB)


def test_no_memory_left_for_the_cache_names_the_flags_to_change() -> None:
    with pytest.raises(CacheBudgetError, match="raise --cuda-memory-fraction, lower --max-batch-prefill-tokens"):
        cuda_cache_budget(2 * GIB, 3 * GIB, 0.9)
    with pytest.raises(CacheBudgetError, match="raise --cuda-memory-fraction"):
        blocks_for_budget(
            CacheGeometry(32, 16, 8, 128, torch.bfloat16).bytes_per_block, 3 * 1024**2, "--cuda-memory-fraction"
        )


@pytest.mark.parametrize(("requests", "expected"), [(1, 1), (3, 4), (4, 4), (33, 64), (64, 64), (65, None)])
def test_a_decode_batch_pads_to_the_next_captured_size(requests: int, expected: int | None) -> None:
    assert graph_batch_size(requests, DEFAULT_CUDA_GRAPH_SIZES) == expected


def test_padded_decode_rows_attend_only_to_the_reserved_block_and_real_rows_are_unchanged() -> None:
    case = paged_case(DECODE_STEP, seed=5)
    batch = case.batch()
    assert is_decode_only(batch.metadata) and not is_decode_only(paged_case(((0, 3), (2, 1))).batch().metadata)
    # The case's blocks 0..NUM_BLOCKS-1 belong to requests; block NUM_BLOCKS is the reserved one.
    buffers = StaticDecodeMetadata.allocate(8, 64, BLOCK_SIZE, NUM_BLOCKS, torch.device("cpu"))
    buffers.fill(batch.metadata, 8)
    count = len(DECODE_STEP)
    assert buffers.seq_lens.tolist() == [5, 12, 1, 21, 1, 1, 1, 1]
    assert buffers.slot_mapping[count:].tolist() == [NUM_BLOCKS * BLOCK_SIZE] * (8 - count)
    assert buffers.block_tables[count:, 0].tolist() == [NUM_BLOCKS] * (8 - count)

    cache = LayerCache(
        torch.cat([case.cache.key, torch.zeros_like(case.cache.key[:1])]),
        torch.cat([case.cache.value, torch.zeros_like(case.cache.value[:1])]),
    )
    expected_cache = LayerCache(cache.key.clone(), cache.value.clone())
    params = AttentionParams(scale=HEAD_DIM**-0.5)
    expected = TorchAttentionBackend().forward(
        case.query, case.key, case.value, expected_cache, case.torch_metadata(), params
    )
    padded = (torch.cat([t, torch.zeros(8 - count, *t.shape[1:])]) for t in (case.query, case.key, case.value))
    output = SdpaAttentionBackend().forward(*padded, cache, buffers.view(8), params)
    torch.testing.assert_close(output[:count], expected, atol=1e-5, rtol=1e-5)
    assert output.shape == (8, HEADS, HEAD_DIM) and torch.isfinite(output).all()
    # Every block a request owns holds what the unpadded step wrote; padding touched only the reserved block.
    torch.testing.assert_close(cache.key[:NUM_BLOCKS], expected_cache.key[:NUM_BLOCKS])


def test_refilling_with_a_smaller_batch_turns_old_rows_into_padding() -> None:
    buffers = StaticDecodeMetadata.allocate(4, 32, BLOCK_SIZE, 8, torch.device("cpu"))
    buffers.fill(paged_case(DECODE_STEP).batch().metadata, 4)
    buffers.fill(paged_case(DECODE_STEP[:1]).batch().metadata, 2)
    assert buffers.seq_lens[:2].tolist() == [5, 1]
    assert buffers.view(2).paged.block_tables.shape == (2, 8)


def test_graph_inputs_pad_token_rows_with_token_0_at_position_0_beside_padded_metadata() -> None:
    cache = KVCache(CacheGeometry(1, BLOCK_SIZE, KV_HEADS, HEAD_DIM, torch.float32), 8, torch.device("cpu"))
    buffers = DecodeBuffers.allocate(4, 32, cache, torch.device("cpu"))
    two = [ScheduledSpan([7], 5, [2, 3]), ScheduledSpan([9], 2, [4])]
    buffers.fill(build_step_batch(two, BLOCK_SIZE, torch.device("cpu")), 2)
    buffers.fill(build_step_batch([ScheduledSpan([11], 6, [2, 3])], BLOCK_SIZE, torch.device("cpu")), 2)
    assert buffers.input_ids[:2].tolist() == [11, 0]
    assert buffers.positions[:2].tolist() == [6, 0]
    # Position 6 is offset 2 of block 3; the padding row writes offset 0 of the reserved block 8.
    assert buffers.attention.slot_mapping[:2].tolist() == [3 * BLOCK_SIZE + 2, 8 * BLOCK_SIZE]


def test_the_padded_batch_a_graph_runs_gives_the_eager_decode_rows(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path)
    model = load_tiny_model(tmp_path, backend=SdpaAttentionBackend())
    spec, cpu = model.spec, torch.device("cpu")
    cache = KVCache(CacheGeometry(spec.num_layers, BLOCK_SIZE, spec.num_kv_heads, spec.head_dim, torch.float32), 8, cpu)
    for layer in cache.layers:
        layer.key.normal_(generator=torch.Generator().manual_seed(1))
        layer.value.normal_(generator=torch.Generator().manual_seed(2))
    spans = [ScheduledSpan([5], 3, [0]), ScheduledSpan([7], 6, [1, 2]), ScheduledSpan([9], 0, [3])]
    batch = build_step_batch(spans, BLOCK_SIZE, cpu)
    eager = forward_step(model, batch, cache.layers)
    buffers = DecodeBuffers.allocate(4, spec.max_position_embeddings, cache, cpu)
    buffers.fill(batch, 4)
    # The step's K/V land in the same slots again, and the padding row only in the reserved block.
    padded = forward_step(model, buffers.view(4), cache.layers)
    torch.testing.assert_close(padded[:3], eager, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("text", "device", "expected"),
    [
        (None, "cuda", DEFAULT_CUDA_GRAPH_SIZES),
        (None, "cpu", ()),
        ("0", "cuda", ()),
        ("", "cuda", ()),
        ("8, 1,4,4", "cuda", (1, 4, 8)),
    ],
)
def test_cuda_graph_sizes_flag(text: str | None, device: str, expected: tuple[int, ...]) -> None:
    assert parse_cuda_graph_sizes(text, device) == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cuda-graphs", "1,two"], "--cuda-graphs must be comma-separated batch sizes"),
        (["--cuda-graphs", "0,4"], "--cuda-graphs batch sizes must be positive"),
        (["--cuda-graphs", "1,2"], "--cuda-graphs needs --device cuda"),
        (["--cuda-memory-fraction", "1.2"], "--cuda-memory-fraction must be in"),
        (["--attention-backend", "flashy"], "unknown attention backend 'flashy'"),
    ],
)
def test_bad_cuda_flags_are_config_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_args([*SHARD, *argv])


def test_shard_defaults_are_auto_backend_and_graphs_only_on_cuda() -> None:
    cpu = config_from_args(SHARD)
    assert (cpu.attention_backend, cpu.cuda_graph_sizes, cpu.cuda_memory_fraction) == ("auto", (), 0.9)
    cuda = config_from_args([*SHARD, "--device", "cuda", "--cuda-memory-fraction", "0.8"])
    assert (cuda.cuda_graph_sizes, cuda.cuda_memory_fraction) == (DEFAULT_CUDA_GRAPH_SIZES, 0.8)
    assert ShardConfig(model_path=cpu.model_path, uds_path=cpu.uds_path).attention_backend == "auto"


def test_each_rank_owns_the_gpu_of_its_number() -> None:
    assert rank_device(3, "cuda", 4) == torch.device("cuda", 3)
    assert rank_device(3, "cpu", 0) == torch.device("cpu")
    with pytest.raises(ConfigError, match="rank 2 needs cuda:2 but 2 CUDA device"):
        rank_device(2, "cuda", 2)


def test_cpu_step_timer_reports_one_duration_per_phase() -> None:
    timer = StepTimer(torch.device("cpu"))
    timer.mark()
    timer.mark()
    phases = timer.phases_ms()
    assert len(phases) == 2 and all(phase >= 0.0 for phase in phases)
