"""The torch attention backend over the paged cache equals naive attention over each request's full sequence."""

from __future__ import annotations

import random

import pytest
import torch
from tandem_server.execution.batch import ScheduledSpan, build_step_batch
from tandem_server.layers.attention import AttentionParams, LayerCache, TorchAttentionBackend
from tandem_server.layers.attention.torch_metadata import TorchAttentionMetadata

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 4, 2, 8, 4, 32
# (cached prefix length, tokens in this step): prompts, a chunk at an offset, decodes, a 1-token prompt.
REQUESTS = [(0, 6), (5, 4), (7, 1), (0, 1), (9, 1), (3, 2)]


def naive_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, sinks: torch.Tensor | None = None
) -> torch.Tensor:
    """query [n, H, D] at positions start.., keys/values [start + n, KVH, D]; causal, GQA by repetition; each head's
    sink, when given, is one more score in its softmax whose weight multiplies nothing."""
    groups = HEADS // KV_HEADS
    keys = keys.repeat_interleave(groups, dim=1)
    values = values.repeat_interleave(groups, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query, keys) / HEAD_DIM**0.5
    query_pos = torch.arange(start, start + query.shape[0]).unsqueeze(1)
    scores = scores.masked_fill(torch.arange(keys.shape[0]).unsqueeze(0) > query_pos, float("-inf"))
    if sinks is not None:
        sink_scores = sinks.view(HEADS, 1, 1).expand(HEADS, query.shape[0], 1)
        weights = torch.cat((scores, sink_scores), dim=-1).softmax(dim=-1)[..., :-1]
        return torch.einsum("hqk,khd->qhd", weights, values)
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), values)


# Sinks of both signs and sizes: large ones take most of a row's weight, so ignoring them changes every output.
SINKS = torch.tensor([2.0, -1.0, 0.5, 3.0])


@pytest.mark.parametrize("sinks", [None, SINKS], ids=["plain", "sinks"])
def test_paged_attention_matches_naive_reference_for_mixed_step(sinks: torch.Tensor | None) -> None:
    torch.manual_seed(0)
    rng = random.Random(0)
    shape = (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    cache = LayerCache(torch.zeros(shape), torch.zeros(shape))
    free = list(range(NUM_BLOCKS))
    rng.shuffle(free)

    spans, full_keys, full_values, queries = [], [], [], []
    for start, count in REQUESTS:
        total = start + count
        table = [free.pop() for _ in range(-(-total // BLOCK_SIZE))]
        keys, values = torch.randn(total, KV_HEADS, HEAD_DIM), torch.randn(total, KV_HEADS, HEAD_DIM)
        for pos in range(start):
            block, offset = table[pos // BLOCK_SIZE], pos % BLOCK_SIZE
            cache.key[block, offset], cache.value[block, offset] = keys[pos], values[pos]
        spans.append(ScheduledSpan([0] * count, start, table))
        full_keys.append(keys)
        full_values.append(values)
        queries.append(torch.randn(count, HEADS, HEAD_DIM))

    batch = build_step_batch(spans, BLOCK_SIZE, torch.device("cpu"))
    metadata = TorchAttentionBackend().prepare(batch.metadata, [cache]).metadata
    step_keys = torch.cat([k[s:] for k, (s, _) in zip(full_keys, REQUESTS, strict=True)])
    step_values = torch.cat([v[s:] for v, (s, _) in zip(full_values, REQUESTS, strict=True)])
    params = AttentionParams(scale=HEAD_DIM**-0.5, sinks=sinks)
    output = TorchAttentionBackend().forward(torch.cat(queries), step_keys, step_values, cache, metadata, params)

    row = 0
    for (start, count), query, keys, values in zip(REQUESTS, queries, full_keys, full_values, strict=True):
        expected = naive_attention(query, keys, values, start, sinks)
        torch.testing.assert_close(output[row : row + count], expected, atol=1e-5, rtol=1e-5)
        if sinks is not None:
            without_sinks = naive_attention(query, keys, values, start)
            assert (output[row : row + count] - without_sinks).abs().max() > 0.05
        row += count
    assert isinstance(metadata, TorchAttentionMetadata)
    assert metadata.decode is not None and len(metadata.decode.query_rows) == 3
    assert len(metadata.prefills) == 3


def test_slot_mapping_follows_block_table() -> None:
    span = ScheduledSpan([1, 2, 3], start_position=5, block_table=[7, 2, 9])
    batch = build_step_batch([span], block_size=4, device=torch.device("cpu"))
    # Positions 5, 6, 7 live in the second block (id 2) at offsets 1, 2, 3.
    assert batch.metadata.slot_mapping.tolist() == [9, 10, 11]
    assert batch.positions.tolist() == [5, 6, 7]


def test_decode_gathers_reuse_their_buffers_across_steps_of_any_shape() -> None:
    torch.manual_seed(1)
    shape = (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    cache = LayerCache(torch.randn(shape), torch.randn(shape))
    params = AttentionParams(scale=HEAD_DIM**-0.5)
    reused = TorchAttentionBackend()
    # Batches that grow, shrink and grow again, with contexts of different lengths and shuffled blocks.
    for step, contexts in enumerate([[3, 9], [13, 2, 7, 5], [4], [15, 16, 1, 11, 6]]):
        tables = [random.Random(step * 10 + i).sample(range(NUM_BLOCKS), 4) for i in range(len(contexts))]
        spans = [ScheduledSpan([0], context - 1, table) for context, table in zip(contexts, tables, strict=True)]
        batch = build_step_batch(spans, BLOCK_SIZE, torch.device("cpu"))
        metadata = reused.prepare(batch.metadata, [cache]).metadata
        query = torch.randn(len(contexts), HEADS, HEAD_DIM)
        new_kv = torch.randn(len(contexts), KV_HEADS, HEAD_DIM)
        fresh = TorchAttentionBackend().forward(query, new_kv, new_kv, cache, metadata, params)
        output = reused.forward(query, new_kv, new_kv, cache, metadata, params)
        torch.testing.assert_close(output, fresh, atol=0, rtol=0)
        for row, (context, table) in enumerate(zip(contexts, tables, strict=True)):
            slots = [table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE for pos in range(context)]
            keys = cache.key.view(-1, KV_HEADS, HEAD_DIM)[slots]
            values = cache.value.view(-1, KV_HEADS, HEAD_DIM)[slots]
            expected = naive_attention(query[row : row + 1], keys, values, context - 1)
            torch.testing.assert_close(output[row : row + 1], expected, atol=1e-5, rtol=1e-5)
    first_key_buffer = reused.gather_buffers.take("key", (1,), cache.key).data_ptr()
    reused.forward(query, new_kv, new_kv, cache, metadata, params)
    assert reused.gather_buffers.take("key", (1,), cache.key).data_ptr() == first_key_buffer


def test_a_step_of_decodes_only_attends_as_its_decodes_do_inside_a_mixed_step() -> None:
    torch.manual_seed(2)
    shape = (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    cache = LayerCache(torch.randn(shape), torch.randn(shape))
    params = AttentionParams(scale=HEAD_DIM**-0.5)
    decodes = [ScheduledSpan([0], context - 1, [5 + i, 9 + i, 20 + i]) for i, context in enumerate([3, 11, 7])]
    prefill = ScheduledSpan([0] * 3, 0, [1])
    query, new_kv = torch.randn(4, HEADS, HEAD_DIM), torch.randn(4, KV_HEADS, HEAD_DIM)

    outputs = []
    for spans, rows in ((decodes, 3), ([*decodes, prefill], 6)):
        backend = TorchAttentionBackend()
        metadata = backend.prepare(build_step_batch(spans, BLOCK_SIZE, torch.device("cpu")).metadata, [cache]).metadata
        assert isinstance(metadata, TorchAttentionMetadata) and metadata.decode is not None
        # Only a step of decodes alone has a decode group covering every row in order.
        assert metadata.decode.every_row == (rows == 3)
        step_query = torch.cat([query[:3], query[3:].expand(rows - 3, -1, -1)])
        step_kv = torch.cat([new_kv[:3], new_kv[3:].expand(rows - 3, -1, -1)])
        outputs.append(
            backend.forward(
                step_query, step_kv, step_kv, LayerCache(cache.key.clone(), cache.value.clone()), metadata, params
            )
        )
    assert torch.equal(outputs[0], outputs[1][:3])
    for row, span in enumerate(decodes):
        context = span.start_position + 1
        slots = [span.block_table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE for pos in range(context - 1)]
        keys = torch.cat([cache.key.view(-1, KV_HEADS, HEAD_DIM)[slots], new_kv[row : row + 1]])
        values = torch.cat([cache.value.view(-1, KV_HEADS, HEAD_DIM)[slots], new_kv[row : row + 1]])
        expected = naive_attention(query[row : row + 1], keys, values, context - 1)
        torch.testing.assert_close(outputs[0][row : row + 1], expected, atol=1e-5, rtol=1e-5)
