"""The shapes CUDA graphs are captured for and the padded layouts they replay, checked on CPU: which shapes exist,
which one a step takes, and that a step laid out as a shape attends and runs the model as it does unpadded, its
padding touching only the reserved block."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from attention_testing import (
    BLOCK_SIZE,
    DECODE_STEP,
    DRAFTED_STEP,
    HEAD_DIM,
    KV_HEADS,
    NUM_BLOCKS,
    PagedCase,
    UniformCase,
    paged_case,
    reference_output,
    uniform_layout,
)
from shard_testing import load_tiny_model, write_tiny_llama
from tandem_server.device_defaults import DEFAULT_CUDA_GRAPH_SIZES
from tandem_server.execution.batch import ScheduledSpan, build_step_batch
from tandem_server.execution.cuda_graphs import StepBuffers, fitting_shape, graph_shapes, token_rows
from tandem_server.execution.eager import forward_step
from tandem_server.execution.kv_cache import CacheGeometry, KVCache
from tandem_server.layers.attention import (
    AttentionParams,
    SdpaAttentionBackend,
    StaticStepMetadata,
    UniformShape,
    is_decode_only,
)

CPU = torch.device("cpu")
WINDOW = AttentionParams(scale=HEAD_DIM**-0.5, sliding_window=5)


def test_decode_shapes_for_every_size_and_verifying_shapes_up_to_the_drafting_bound() -> None:
    assert graph_shapes((1, 2, 4, 8), max_drafts=0, max_drafting_requests=4) == tuple(
        UniformShape(size, 1) for size in (1, 2, 4, 8)
    )
    assert graph_shapes((1, 2, 4, 8), max_drafts=3, max_drafting_requests=0) == tuple(
        UniformShape(size, 1) for size in (1, 2, 4, 8)
    )
    # 3 drafting requests need the size-4 graph; sizes beyond it never verify drafts.
    verifying = {shape for shape in graph_shapes((1, 2, 4, 8), 3, 3) if shape.tokens_per_row > 1}
    assert verifying == {UniformShape(1, 4), UniformShape(2, 4), UniformShape(4, 4)}
    assert {shape for shape in graph_shapes((8, 1), 3, 64) if shape.tokens_per_row > 1} == {
        UniformShape(1, 4),
        UniformShape(8, 4),
    }
    assert graph_shapes((), 3, 4) == ()


@pytest.mark.parametrize(
    ("rows", "max_query_len", "expected"),
    [
        (1, 1, UniformShape(1, 1)),
        (3, 1, UniformShape(4, 1)),
        (33, 1, UniformShape(64, 1)),
        (1, 5, UniformShape(1, 5)),
        (3, 2, UniformShape(4, 5)),
        (4, 5, UniformShape(4, 5)),
        # Beyond the drafting bound, more drafts than captured, or more rows than any graph: eager.
        (5, 2, None),
        (1, 6, None),
        (257, 1, None),
    ],
)
def test_a_step_takes_the_captured_shape_of_fewest_tokens_that_holds_it(
    rows: int, max_query_len: int, expected: UniformShape | None
) -> None:
    shapes = graph_shapes(DEFAULT_CUDA_GRAPH_SIZES, max_drafts=4, max_drafting_requests=4)
    assert fitting_shape(shapes, rows, max_query_len) == expected


def test_tokens_move_to_the_start_of_their_rows_only_when_rows_are_short() -> None:
    assert token_rows([1, 1, 1], 1) is None
    assert token_rows([3, 3], 3) is None
    assert token_rows([1, 4, 3], 4) == [0, 4, 5, 6, 7, 8, 9, 10]


def test_padded_decode_rows_attend_only_to_the_reserved_block_and_real_rows_are_unchanged() -> None:
    case = paged_case(DECODE_STEP, seed=5)
    assert is_decode_only(case.batch().metadata) and not is_decode_only(paged_case(((0, 3), (2, 1))).batch().metadata)
    laid_out = uniform_layout(case, UniformShape(8, 1))
    count = len(DECODE_STEP)
    paged = laid_out.metadata.paged
    assert paged.seq_lens.tolist() == [5, 12, 1, 21, 1, 1, 1, 1]
    assert laid_out.metadata.slot_mapping[count:].tolist() == [NUM_BLOCKS * BLOCK_SIZE] * (8 - count)
    assert paged.block_tables[count:, 0].tolist() == [NUM_BLOCKS] * (8 - count)
    _assert_attends_like_the_unpadded_step(case, laid_out)


def test_drafted_rows_padded_to_the_verifying_width_attend_like_the_unpadded_step() -> None:
    case = paged_case(DRAFTED_STEP, seed=7)
    shape = UniformShape(4, 5)
    laid_out = uniform_layout(case, shape)
    assert laid_out.rows.tolist() == [0, 5, 6, 7, 8, 10, 11, 12]
    paged = laid_out.metadata.paged
    # Each request's context grows by its padding tokens; the padding row holds 5 tokens in the reserved block.
    assert paged.seq_lens.tolist() == [5 + 4, 15 + 1, 23 + 2, 5]
    assert paged.query_start_loc.tolist() == [0, 5, 10, 15, 20]
    padding = sorted(set(range(20)) - set(laid_out.rows.tolist()))
    assert set(laid_out.metadata.slot_mapping[padding].tolist()) == {NUM_BLOCKS * BLOCK_SIZE}
    _assert_attends_like_the_unpadded_step(case, laid_out)


def _assert_attends_like_the_unpadded_step(case: PagedCase, laid_out: UniformCase) -> None:
    rows = laid_out.rows
    expected, expected_cache = reference_output(case, WINDOW)
    output = SdpaAttentionBackend().forward(
        laid_out.query, laid_out.key, laid_out.value, laid_out.cache, laid_out.metadata, WINDOW
    )
    torch.testing.assert_close(output.index_select(0, rows), expected, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(output).all()
    # Every block a request owns holds what the unpadded step wrote; padding touched only the reserved block.
    torch.testing.assert_close(laid_out.cache.key[:NUM_BLOCKS], expected_cache.key)
    torch.testing.assert_close(laid_out.cache.value[:NUM_BLOCKS], expected_cache.value)


def test_refilling_with_a_smaller_step_turns_old_rows_into_padding() -> None:
    shape = UniformShape(4, 1)
    buffers = StaticStepMetadata.allocate((shape,), 32, BLOCK_SIZE, 8, CPU)
    buffers.fill(paged_case(DECODE_STEP).batch().metadata, shape, None)
    buffers.fill(paged_case(DECODE_STEP[:1]).batch().metadata, UniformShape(2, 1), None)
    assert buffers.seq_lens[:2].tolist() == [5, 1]
    assert buffers.view(UniformShape(2, 1)).paged.block_tables.shape == (2, 8)


def test_graph_inputs_pad_tokens_with_token_0_at_position_0_beside_padded_metadata() -> None:
    cache = KVCache(CacheGeometry(1, BLOCK_SIZE, KV_HEADS, HEAD_DIM, torch.float32), 8, CPU)
    shapes = (UniformShape(2, 1), UniformShape(2, 3))
    buffers = StepBuffers.allocate(shapes, 32, cache, CPU)
    two = [ScheduledSpan([7], 5, [2, 3]), ScheduledSpan([9], 2, [4])]
    buffers.fill(build_step_batch(two, BLOCK_SIZE, CPU), shapes[0])
    buffers.fill(build_step_batch([ScheduledSpan([11], 6, [2, 3])], BLOCK_SIZE, CPU), shapes[0])
    assert buffers.input_ids[:2].tolist() == [11, 0]
    assert buffers.positions[:2].tolist() == [6, 0]
    # Position 6 is offset 2 of block 3; the padding row writes offset 0 of the reserved block 8.
    assert buffers.attention.slot_mapping[:2].tolist() == [3 * BLOCK_SIZE + 2, 8 * BLOCK_SIZE]
    drafted = [ScheduledSpan([11, 12], 6, [2, 3]), ScheduledSpan([9, 13, 14], 2, [4])]
    rows = buffers.fill(build_step_batch(drafted, BLOCK_SIZE, CPU), shapes[1])
    assert rows is not None and rows.tolist() == [0, 1, 3, 4, 5]
    assert buffers.input_ids[:6].tolist() == [11, 12, 0, 9, 13, 14]
    assert buffers.positions[:6].tolist() == [6, 7, 0, 2, 3, 4]


@pytest.mark.parametrize(
    ("spans", "shape"),
    [
        ([ScheduledSpan([5], 3, [0]), ScheduledSpan([7], 6, [1, 2]), ScheduledSpan([9], 0, [3])], UniformShape(4, 1)),
        (
            [ScheduledSpan([5, 6, 8], 3, [0, 4]), ScheduledSpan([7], 6, [1, 2]), ScheduledSpan([9, 10], 0, [3])],
            UniformShape(4, 4),
        ),
    ],
    ids=["decode", "verify"],
)
def test_the_padded_batch_a_graph_runs_gives_the_eager_rows(
    tmp_path: Path, spans: list[ScheduledSpan], shape: UniformShape
) -> None:
    write_tiny_llama(tmp_path)
    model = load_tiny_model(tmp_path, backend=SdpaAttentionBackend())
    spec = model.spec
    geometry = CacheGeometry(spec.num_layers, BLOCK_SIZE, spec.num_kv_heads, spec.head_dim, torch.float32)
    cache = KVCache(geometry, 8, CPU)
    for layer in cache.layers:
        layer.key.normal_(generator=torch.Generator().manual_seed(1))
        layer.value.normal_(generator=torch.Generator().manual_seed(2))
    batch = build_step_batch(spans, BLOCK_SIZE, CPU)
    eager = forward_step(model, batch, cache.layers)
    buffers = StepBuffers.allocate((shape,), spec.max_position_embeddings, cache, CPU)
    rows = buffers.fill(batch, shape)
    # The step's K/V land in the same slots again, and the padding only in the reserved block.
    padded = forward_step(model, buffers.view(shape), cache.layers)
    real = padded.index_select(0, rows) if rows is not None else padded[: batch.input_ids.shape[0]]
    torch.testing.assert_close(real, eager, atol=1e-5, rtol=1e-5)
