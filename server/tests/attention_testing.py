"""Random paged attention inputs shared by the backend tests: shuffled block tables, mixed steps, GQA."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tandem_server.execution.batch import ScheduledSpan, StepBatch, build_step_batch
from tandem_server.execution.cuda_graphs import token_rows
from tandem_server.layers.attention import (
    AttentionMetadata,
    AttentionParams,
    LayerCache,
    StaticStepMetadata,
    TorchAttentionBackend,
    UniformShape,
)

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 8, 2, 24, 4, 48
CPU = torch.device("cpu")
# (cached prefix length, tokens this step): prompts, chunks after cached prefixes, decodes, a 1-token prompt.
MIXED_STEP = ((0, 7), (5, 4), (13, 1), (0, 1), (9, 1), (3, 2), (16, 5))
DECODE_STEP = ((4, 1), (11, 1), (0, 1), (20, 1))
# Decodes carrying 0, 3 and 2 drafts, as a verifying step runs them.
DRAFTED_STEP = ((4, 1), (11, 4), (20, 3))


@dataclass(frozen=True)
class PagedCase:
    """A filled cache plus one step's queries, keys and values over shuffled blocks."""

    spans: tuple[ScheduledSpan, ...]
    cache: LayerCache
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    block_size: int = BLOCK_SIZE

    def fresh_cache(self) -> LayerCache:
        """A copy, since every backend writes the step's K/V into the cache it is given."""
        return LayerCache(self.cache.key.clone(), self.cache.value.clone())

    def batch(self, device: torch.device = CPU) -> StepBatch:
        return build_step_batch(self.spans, self.block_size, device)

    def torch_metadata(self) -> AttentionMetadata:
        """The step's metadata as the torch backend prepares it (slot lists beside the common layout)."""
        return TorchAttentionBackend().prepare(self.batch().metadata, [self.cache]).metadata


def paged_case(
    requests: Sequence[tuple[int, int]],
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    block_size: int = BLOCK_SIZE,
    heads: tuple[int, int, int] = (HEADS, KV_HEADS, HEAD_DIM),
) -> PagedCase:
    """Cached prefixes hold random K/V; block ids are drawn from a shuffled pool so tables are scattered.

    `heads` is (query heads, KV heads, head size)."""
    num_heads, num_kv_heads, head_dim = heads
    generator = torch.Generator().manual_seed(seed)
    free = list(range(NUM_BLOCKS))
    random.Random(seed).shuffle(free)
    shape = (NUM_BLOCKS, block_size, num_kv_heads, head_dim)
    cache = LayerCache(
        torch.randn(shape, generator=generator).to(dtype), torch.randn(shape, generator=generator).to(dtype)
    )
    spans = tuple(
        ScheduledSpan([0] * count, start, [free.pop() for _ in range(-(-(start + count) // block_size))])
        for start, count in requests
    )
    tokens = sum(count for _, count in requests)
    return PagedCase(
        spans=spans,
        cache=cache,
        query=torch.randn(tokens, num_heads, head_dim, generator=generator).to(dtype),
        key=torch.randn(tokens, num_kv_heads, head_dim, generator=generator).to(dtype),
        value=torch.randn(tokens, num_kv_heads, head_dim, generator=generator).to(dtype),
        block_size=block_size,
    )


def reference_output(case: PagedCase, params: AttentionParams) -> tuple[torch.Tensor, LayerCache]:
    """The torch backend's output (computed in float32 from the case's values) and the cache it leaves behind."""
    cache = case.fresh_cache()
    output = TorchAttentionBackend().forward(
        case.query.float(), case.key.float(), case.value.float(), cache, case.torch_metadata(), params
    )
    return output, cache


@dataclass(frozen=True)
class UniformCase:
    """A case laid out as a captured graph's shape: the cache grows the reserved block (id NUM_BLOCKS), the
    step's queries, keys and values sit at their rows of the layout (zeros elsewhere)."""

    cache: LayerCache
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    metadata: AttentionMetadata
    # The layout's row of each of the case's tokens.
    rows: torch.Tensor


def uniform_layout(case: PagedCase, shape: UniformShape, max_positions: int = 64) -> UniformCase:
    """`case` filled into buffers of `shape` as a graph replay would see it."""
    buffers = StaticStepMetadata.allocate((shape,), max_positions, case.block_size, NUM_BLOCKS, CPU)
    query_lens = [len(span.token_ids) for span in case.spans]
    listed = token_rows(query_lens, shape.tokens_per_row)
    rows = torch.tensor(listed) if listed is not None else torch.arange(sum(query_lens))
    buffers.fill(case.batch().metadata, shape, rows if listed is not None else None)

    def laid_out(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.new_zeros(shape.tokens, *tensor.shape[1:]).index_copy_(0, rows, tensor)

    cache = LayerCache(
        torch.cat([case.cache.key, torch.zeros_like(case.cache.key[:1])]),
        torch.cat([case.cache.value, torch.zeros_like(case.cache.value[:1])]),
    )
    return UniformCase(cache, laid_out(case.query), laid_out(case.key), laid_out(case.value), buffers.view(shape), rows)
