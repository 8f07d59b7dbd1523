"""The torch backend honours per-layer sliding windows and score soft-capping over the paged cache."""

from __future__ import annotations

import random

import pytest
import torch
from tandem_server.execution.batch import ScheduledSpan, build_step_batch
from tandem_server.layers.attention import AttentionParams, LayerCache, TorchAttentionBackend

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 4, 2, 8, 4, 48
# (cached prefix length, tokens in this step): a long prompt, chunks past the window, decodes near and far.
REQUESTS = [(0, 11), (9, 5), (14, 1), (2, 1), (0, 3), (20, 1)]


def naive_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, params: AttentionParams
) -> torch.Tensor:
    """query [n, H, D] at positions start.., keys/values [start + n, KVH, D]; key k visible iff q - window < k <= q."""
    groups = HEADS // KV_HEADS
    keys = keys.repeat_interleave(groups, dim=1)
    values = values.repeat_interleave(groups, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query, keys) * params.scale
    if params.logit_softcap is not None:
        scores = torch.tanh(scores / params.logit_softcap) * params.logit_softcap
    query_pos = torch.arange(start, start + query.shape[0]).unsqueeze(1)
    key_pos = torch.arange(keys.shape[0]).unsqueeze(0)
    hidden = key_pos > query_pos
    if params.sliding_window is not None:
        hidden |= key_pos <= query_pos - params.sliding_window
    scores = scores.masked_fill(hidden, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), values)


@pytest.mark.parametrize(
    "params",
    [
        AttentionParams(scale=0.3, sliding_window=4),
        AttentionParams(scale=0.3, sliding_window=1),
        AttentionParams(scale=0.5, logit_softcap=2.0),
        AttentionParams(scale=0.5, sliding_window=6, logit_softcap=2.0),
        AttentionParams(scale=0.2, sliding_window=64),
    ],
    ids=["window-4", "window-1", "softcap", "window-and-softcap", "window-longer-than-sequences"],
)
def test_windowed_and_capped_attention_matches_naive_reference(params: AttentionParams) -> None:
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
        queries.append(torch.randn(count, HEADS, HEAD_DIM) * 3)

    batch = build_step_batch(spans, BLOCK_SIZE, torch.device("cpu"))
    step_keys = torch.cat([k[s:] for k, (s, _) in zip(full_keys, REQUESTS, strict=True)])
    step_values = torch.cat([v[s:] for v, (s, _) in zip(full_values, REQUESTS, strict=True)])
    backend = TorchAttentionBackend()
    metadata = backend.prepare(batch.metadata, [cache]).metadata
    output = backend.forward(torch.cat(queries), step_keys, step_values, cache, metadata, params)

    row = 0
    for (start, count), query, keys, values in zip(REQUESTS, queries, full_keys, full_values, strict=True):
        expected = naive_attention(query, keys, values, start, params)
        torch.testing.assert_close(output[row : row + count], expected, atol=1e-5, rtol=1e-5, msg=f"{start}+{count}")
        row += count


def test_window_of_one_attends_only_to_the_token_itself() -> None:
    cache = LayerCache(torch.zeros(4, BLOCK_SIZE, 1, 2), torch.zeros(4, BLOCK_SIZE, 1, 2))
    batch = build_step_batch([ScheduledSpan([0] * 6, 0, [3, 1])], BLOCK_SIZE, torch.device("cpu"))
    values = torch.arange(12, dtype=torch.float32).view(6, 1, 2)
    query, keys = torch.randn(6, 1, 2), torch.randn(6, 1, 2)
    backend = TorchAttentionBackend()
    metadata = backend.prepare(batch.metadata, [cache]).metadata
    output = backend.forward(query, keys, values, cache, metadata, AttentionParams(1.0, 1))
    torch.testing.assert_close(output, values)
