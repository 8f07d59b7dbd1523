"""The Triton paged-attention kernel against the torch backend: run on CUDA, or on CPU by Triton's interpreter.

Not collected by default (no `test_` prefix): `test_attention_backends.py` runs it in a subprocess with
TRITON_INTERPRET=1, and `make gpu-check` runs it on CUDA in bfloat16.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch
from attention_testing import (
    DECODE_STEP,
    DRAFTED_STEP,
    HEAD_DIM,
    MIXED_STEP,
    PagedCase,
    paged_case,
    reference_output,
    uniform_layout,
)
from tandem_server.layers.attention import AttentionMetadata, AttentionParams, LayerCache, UniformShape

ON_CUDA = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")
DTYPE = torch.bfloat16 if ON_CUDA else torch.float32
# bfloat16 keeps 8 mantissa bits; the reference runs in float32 on the same bfloat16 inputs.
TOLERANCE = {"atol": 2e-2, "rtol": 2e-2} if ON_CUDA else {"atol": 2e-5, "rtol": 2e-5}
# One per query head of attention_testing's cases (8): large ones take most of a row's weight.
SINKS = torch.tensor([2.0, -1.0, 0.5, 3.0, 0.0, -4.0, 1.5, 6.0])
PARAMS = {
    "causal": AttentionParams(scale=HEAD_DIM**-0.5),
    "sliding_window": AttentionParams(scale=HEAD_DIM**-0.5, sliding_window=5),
    "softcap": AttentionParams(scale=0.3, logit_softcap=2.5),
    "window_and_softcap": AttentionParams(scale=0.3, sliding_window=3, logit_softcap=2.5),
    "sinks": AttentionParams(scale=HEAD_DIM**-0.5, sinks=SINKS),
    "window_and_sinks": AttentionParams(scale=HEAD_DIM**-0.5, sliding_window=5, sinks=SINKS),
}
STEPS = {"mixed": MIXED_STEP, "decode_only": DECODE_STEP}

if not ON_CUDA and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs CUDA or TRITON_INTERPRET=1", allow_module_level=True)


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("params", PARAMS)
def test_triton_kernel_matches_torch_backend(step: str, params: str) -> None:
    case = paged_case(STEPS[step], seed=len(params), dtype=DTYPE)
    assert_matches_torch_backend(case, PARAMS[params])


# Corners of the ahead-of-time compile matrix (test_triton_compile.py): head size 64, one, seven and eight query
# heads per KV head, 16- and 256-token pages; a prefill spanning several query tiles, a long-context decode split
# across programs, windows with softcap.
LONG_PREFILL = ((0, 21), (40, 30), (3, 1))
LONG_DECODE = ((520, 1), (7, 1))
CORNERS = {
    "groups1-page16-prefill": (LONG_PREFILL, 16, (2, 2, 64)),
    "groups7-page16-prefill": (LONG_PREFILL, 16, (14, 2, 64)),
    "groups8-page256-prefill": (LONG_PREFILL, 256, (8, 1, 64)),
    "groups7-page256-split-decode": (LONG_DECODE, 256, (7, 1, 64)),
    "groups1-page16-split-decode": (LONG_DECODE, 16, (2, 2, 64)),
}


def test_triton_kernel_adds_each_heads_sink_once_across_decode_splits() -> None:
    from tandem_server.layers.attention.triton_backend import DEFAULT_SM_COUNT, decode_splits  # noqa: PLC0415

    case = paged_case(LONG_DECODE, seed=19, dtype=DTYPE, block_size=16, heads=(8, 2, 64))
    assert decode_splits(len(LONG_DECODE), 2, 521, DEFAULT_SM_COUNT) > 1
    params = AttentionParams(scale=0.125, sliding_window=300, sinks=SINKS)
    assert_matches_torch_backend(case, params)
    without_sinks, _ = reference_output(case, replace(params, sinks=None))
    with_sinks, _ = reference_output(case, params)
    assert (with_sinks - without_sinks).abs().max() > 0.05


@pytest.mark.parametrize("corner", CORNERS)
def test_triton_kernel_corners_match_torch_backend(corner: str) -> None:
    from tandem_server.layers.attention.triton_backend import DEFAULT_SM_COUNT, decode_splits  # noqa: PLC0415

    requests, block_size, heads = CORNERS[corner]
    case = paged_case(requests, seed=11, dtype=DTYPE, block_size=block_size, heads=heads)
    if "decode" in corner:
        # The interpreter's step splits each context across programs, so the combine kernel runs too.
        longest = max(start + count for start, count in requests)
        assert decode_splits(len(requests), heads[1], longest, DEFAULT_SM_COUNT) > 1
    assert_matches_torch_backend(case, AttentionParams(scale=0.125, sliding_window=200, logit_softcap=20.0))


# The tiles of each shared-memory size (triton_kernel.tile_config) at the head sizes where they differ: in float32,
# key tiles of 64 (head size 128) and 32 (256) keys on sm90, of 32 and 16 on sm89.
GPU_TILES = {"sm90": (9, 0), "sm89": (8, 9)}
# (requests, KV heads of 8 query heads) over 16-token pages.
TILED_STEPS = {"prefill": (LONG_PREFILL, 2), "split-decode": (LONG_DECODE, 4)}


@pytest.mark.parametrize("gpu", GPU_TILES)
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("step", TILED_STEPS)
def test_triton_kernel_tiles_of_every_gpu_match_torch_backend(gpu: str, head_dim: int, step: str) -> None:
    requests, kv_heads = TILED_STEPS[step]
    case = paged_case(requests, seed=head_dim, dtype=DTYPE, block_size=16, heads=(8, kv_heads, head_dim))
    params = AttentionParams(scale=head_dim**-0.5, sliding_window=300, logit_softcap=20.0)
    assert_matches_torch_backend(case, params, capability=GPU_TILES[gpu])


def assert_matches_torch_backend(
    case: PagedCase, params: AttentionParams, capability: tuple[int, int] | None = None
) -> None:
    from tandem_server.layers.attention.triton_backend import TritonAttentionBackend  # noqa: PLC0415

    expected, expected_cache = reference_output(case, params)
    cache = LayerCache(case.cache.key.to(DEVICE), case.cache.value.to(DEVICE))
    metadata = case.batch(device=DEVICE).metadata
    query, key, value = (tensor.to(DEVICE) for tensor in (case.query, case.key, case.value))
    output = TritonAttentionBackend(capability).forward(query, key, value, cache, metadata, on_device(params))
    torch.testing.assert_close(output.float().cpu(), expected.float(), **TOLERANCE)
    torch.testing.assert_close(cache.key.cpu(), expected_cache.key)
    torch.testing.assert_close(cache.value.cpu(), expected_cache.value)


def on_device(params: AttentionParams) -> AttentionParams:
    """`params` with the sinks (kept on the CPU for the torch backend's reference) in the kernel's device and dtype."""
    return params if params.sinks is None else replace(params, sinks=params.sinks.to(DEVICE, DTYPE))


def test_uniform_steps_spanning_several_query_tiles_need_no_work_list() -> None:
    from tandem_server.layers.attention.triton_backend import TritonAttentionBackend  # noqa: PLC0415

    # Eight query heads per KV head leave 8 tokens per tile: 20 tokens per sequence span 3 tiles.
    case = paged_case(((10, 20), (3, 20)), seed=13, dtype=DTYPE, heads=(16, 2, 64))
    backend = TritonAttentionBackend()
    plan = backend._plan(case.batch(device=DEVICE).metadata.paged, case.query.to(DEVICE), 2)
    assert (plan.work, plan.tiles_per_seq, plan.num_items) == (None, 3, 6)
    assert_matches_torch_backend(case, PARAMS["window_and_softcap"])


def test_drafted_rows_padded_for_a_verifying_graph_attend_like_the_unpadded_step() -> None:
    from tandem_server.layers.attention.triton_backend import TritonAttentionBackend  # noqa: PLC0415

    case = paged_case(DRAFTED_STEP, seed=17, dtype=DTYPE)
    params = PARAMS["sliding_window"]
    expected, _ = reference_output(case, params)
    laid_out = uniform_layout(case, UniformShape(4, 5))
    cache = LayerCache(laid_out.cache.key.to(DEVICE), laid_out.cache.value.to(DEVICE))
    paged = laid_out.metadata.paged
    on_device = replace(
        paged,
        query_start_loc=paged.query_start_loc.to(DEVICE),
        seq_lens=paged.seq_lens.to(DEVICE),
        block_tables=paged.block_tables.to(DEVICE),
    )
    metadata = AttentionMetadata(slot_mapping=laid_out.metadata.slot_mapping.to(DEVICE), paged=on_device)
    query, key, value = (tensor.to(DEVICE) for tensor in (laid_out.query, laid_out.key, laid_out.value))
    output = TritonAttentionBackend().forward(query, key, value, cache, metadata, params)
    real = output.float().cpu().index_select(0, laid_out.rows)
    torch.testing.assert_close(real, expected.float(), **TOLERANCE)
