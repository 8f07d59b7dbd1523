"""Sizes the KV cache from the memory budget and proves a full-budget step runs."""

from __future__ import annotations

import torch

from tandem_server.engine.batch import ScheduledSpan, build_step_batch
from tandem_server.engine.kv_cache import CacheGeometry, KVCache
from tandem_server.errors import CacheBudgetError
from tandem_server.models.registry import CausalLM
from tandem_server.sampling import Sampler, SamplingBatch, SamplingParams, SamplingRow

# Warm-up rows use every sampling processor so their kernels are exercised too.
_WARMUP_SAMPLING = SamplingParams(
    temperature=0.7,
    top_k=50,
    top_p=0.9,
    seed=0,
    min_p=0.01,
    typical_p=0.95,
    repetition_penalty=1.1,
    frequency_penalty=0.1,
    presence_penalty=0.1,
    logit_bias=((0, 1.0),),
)


def blocks_for_budget(geometry: CacheGeometry, budget_bytes: int) -> int:
    """Blocks the router may use; one more block is kept back for health checks."""
    num_blocks = budget_bytes // geometry.bytes_per_block - 1
    if num_blocks < 1:
        raise CacheBudgetError(
            f"KV cache budget of {budget_bytes} bytes holds no block of {geometry.bytes_per_block} bytes "
            f"plus the reserved one; raise --kv-cache-memory"
        )
    return num_blocks


def run_reserved_forward(model: CausalLM, cache: KVCache, num_tokens: int, num_samples: int) -> None:
    """Runs `num_tokens` dummy tokens whose K/V all land in the reserved block, then samples `num_samples` rows."""
    num_tokens = max(1, min(num_tokens, model.spec.max_position_embeddings))
    num_blocks = -(-num_tokens // cache.block_size)
    # Every position wraps into the reserved block, so real blocks are never touched.
    span = ScheduledSpan([0] * num_tokens, 0, [cache.reserved_block] * num_blocks)
    device = cache.layers[0].key.device
    batch = build_step_batch([span], cache.block_size, device)
    hidden = model(batch.input_ids, batch.positions, cache.layers, batch.metadata)
    rows = torch.arange(num_tokens - min(num_samples, num_tokens), num_tokens, device=device)
    logits = model.compute_logits(hidden[rows])
    sampling_rows = [
        SamplingRow(_WARMUP_SAMPLING, position, token_ids=(0, 0), prompt_len=1, banned_ids=(0,), top_logprobs=1)
        for position in range(len(rows))
    ]
    Sampler()(logits, SamplingBatch.build(sampling_rows, device))
