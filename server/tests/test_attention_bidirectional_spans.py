"""The torch backend lets the positions of a bidirectional span (an image's) see each other both ways, the rest
causally, and a sliding window bounds both; the same as naive attention under that mask."""

from __future__ import annotations

import random

import pytest
import torch
from tandem_server.execution.batch import ScheduledSpan, build_step_batch
from tandem_server.layers.attention import AttentionParams, LayerCache, TorchAttentionBackend
from tandem_server.layers.attention.torch_metadata import chunk_mask

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 4, 2, 8, 4, 32
# (cached prefix length, tokens this step, bidirectional spans): a prompt holding one span; a chunk starting inside a
# span after a cached prefix; a prompt holding two spans; a decode beside them.
REQUESTS: tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...] = (
    (0, 12, ((3, 9),)),
    (6, 8, ((2, 10),)),
    (0, 14, ((1, 5), (7, 13))),
    (9, 1, ()),
)


def visible(start: int, context_len: int, spans: tuple[tuple[int, int], ...], window: int | None) -> torch.Tensor:
    """[queries, keys]: a key at or before its query, or in the query's span; within the window either way."""
    mask = torch.zeros(context_len - start, context_len, dtype=torch.bool)
    for query in range(start, context_len):
        for key in range(context_len):
            same_span = any(begin <= query < end and begin <= key < end for begin, end in spans)
            in_window = window is None or key > query - window
            mask[query - start, key] = (key <= query or same_span) and in_window
    return mask


def naive_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    groups = HEADS // KV_HEADS
    keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query, keys) / HEAD_DIM**0.5
    weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", weights, values)


@pytest.mark.parametrize("window", [None, 4], ids=["global", "sliding"])
def test_span_positions_see_each_other_both_ways_within_the_window(window: int | None) -> None:
    torch.manual_seed(0)
    free = list(range(NUM_BLOCKS))
    random.Random(0).shuffle(free)
    shape = (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    cache = LayerCache(torch.zeros(shape), torch.zeros(shape))
    spans, keys, values, queries = [], [], [], []
    for start, count, both_ways in REQUESTS:
        total = start + count
        table = [free.pop() for _ in range(-(-total // BLOCK_SIZE))]
        k, v = torch.randn(total, KV_HEADS, HEAD_DIM), torch.randn(total, KV_HEADS, HEAD_DIM)
        for position in range(start):
            block, offset = table[position // BLOCK_SIZE], position % BLOCK_SIZE
            cache.key[block, offset], cache.value[block, offset] = k[position], v[position]
        spans.append(ScheduledSpan([0] * count, start, table, bidirectional_spans=both_ways))
        keys.append(k)
        values.append(v)
        queries.append(torch.randn(count, HEADS, HEAD_DIM))
    batch = build_step_batch(spans, BLOCK_SIZE, torch.device("cpu"))
    backend = TorchAttentionBackend()
    metadata = backend.prepare(batch.metadata, [cache]).metadata
    step_keys = torch.cat([k[start:] for k, (start, _, _) in zip(keys, REQUESTS, strict=True)])
    step_values = torch.cat([v[start:] for v, (start, _, _) in zip(values, REQUESTS, strict=True)])
    params = AttentionParams(scale=HEAD_DIM**-0.5, sliding_window=window)
    output = backend.forward(torch.cat(queries), step_keys, step_values, cache, metadata, params)
    row = 0
    for (start, count, both_ways), query, k, v in zip(REQUESTS, queries, keys, values, strict=True):
        mask = visible(start, start + count, both_ways, window)
        expected = naive_attention(query, k, v, mask)
        torch.testing.assert_close(output[row : row + count], expected, atol=1e-5, rtol=1e-5)
        if both_ways:
            causal = naive_attention(query, k, v, visible(start, start + count, (), window))
            assert (output[row : row + count] - causal).abs().max() > 0.05
        row += count


def test_a_chunk_mask_opens_each_span_to_itself_and_nothing_else() -> None:
    assert chunk_mask(0, 6) is None
    mask = chunk_mask(0, 6, ((1, 4),))
    assert mask is not None
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)
    after_a_cached_prefix = chunk_mask(2, 6, ((1, 4),))
    assert after_a_cached_prefix is not None and torch.equal(after_a_cached_prefix, expected[2:])
