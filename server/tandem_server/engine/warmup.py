"""Sizes the KV cache (CPU: a memory budget; CUDA: free memory after a profiled step) and proves a full step runs."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from tandem_server.errors import CacheBudgetError
from tandem_server.execution.batch import ScheduledSpan, build_step_batch
from tandem_server.execution.cuda_graphs import profile_graph_bytes
from tandem_server.execution.eager import forward_step
from tandem_server.execution.kv_cache import CacheGeometry, KVCache
from tandem_server.kv_cache_default import CacheFootprint, auto_kv_cache_memory
from tandem_server.layers.attention import UniformShape
from tandem_server.models.registry import CausalLM
from tandem_server.quant.dense_copies import available_memory
from tandem_server.sampling import Sampler, SamplingBatch, SamplingParams, SamplingRow
from tandem_server.sampling.statistics import TokenStatistics

logger = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class WarmupLimits:
    """The largest step the router will schedule, and what Warmup sets aside beside it on CUDA."""

    max_batch_tokens: int
    max_batch_requests: int
    cuda_memory_fraction: float = 0.9
    # Step shapes captured as CUDA graphs; their memory pool is set aside before the KV cache is sized.
    cuda_graph_shapes: tuple[UniformShape, ...] = ()


def blocks_for_budget(bytes_per_block: int, budget_bytes: int, budget_flag: str = "--kv-cache-memory") -> int:
    """Blocks the router may use; one more block is kept back for health checks."""
    num_blocks = budget_bytes // bytes_per_block - 1
    if num_blocks < 1:
        raise CacheBudgetError(
            f"KV cache budget of {budget_bytes} bytes holds no block of {bytes_per_block} bytes "
            f"plus the reserved one; raise {budget_flag}"
        )
    return num_blocks


def cpu_cache_budget(
    given: int | None, geometry: CacheGeometry, draft: CacheGeometry | None, ranks_on_node: int
) -> int:
    """`--kv-cache-memory` as given, or for `auto` (None) the budget chosen from the cache's bytes per token (the
    draft model's beside the model's) and the memory available now that the weights are loaded, logged with why."""
    if given is not None:
        return given
    footprint = CacheFootprint(
        geometry.bytes_per_token + (draft.bytes_per_token if draft is not None else 0),
        describe_geometry(geometry) + (f", plus the draft model's {describe_geometry(draft)}" if draft else ""),
        reserved_tokens=geometry.block_size,
    )
    budget, reason = auto_kv_cache_memory(footprint, available_memory(), ranks_on_node)
    logger.info("%s", reason)
    return budget


def describe_geometry(geometry: CacheGeometry) -> str:
    """`30 layers x 3 kv heads x 64 x keys and values in bfloat16`: the factors of a token's bytes."""
    shapes = set(geometry.shapes)
    heads = f"{geometry.shapes[0][0]} kv heads x {geometry.shapes[0][1]}" if len(shapes) == 1 else "their own kv heads"
    kinds = "latent rows" if geometry.latent_dim is not None else "keys and values"
    dtype = str(geometry.dtype).removeprefix("torch.")
    return f"{geometry.num_layers} layers x {heads} x {kinds} in {dtype}"


def cuda_cache_budget(free_bytes: int, step_peak_bytes: int, memory_fraction: float, graph_bytes: int = 0) -> int:
    """Bytes the KV cache may take: the fraction of free device memory, less what a full-budget step needs and what
    the captured decode graphs hold.

    `free_bytes` is measured with the weights loaded and the profiling step's memory released, so the step's
    peak must be set aside again for every later step; the graphs are captured after the cache is allocated, so
    their pool (which also holds the attention backend's decode workspace) is set aside too.
    """
    budget = int(free_bytes * memory_fraction) - step_peak_bytes - graph_bytes
    if budget <= 0:
        raise CacheBudgetError(
            f"no device memory left for the KV cache: {free_bytes} bytes free x {memory_fraction} "
            f"minus a {step_peak_bytes}-byte step and {graph_bytes} bytes of CUDA graphs; raise "
            "--cuda-memory-fraction, lower --max-batch-prefill-tokens or capture fewer --cuda-graphs"
        )
    return budget


def profile_cuda_budget(model: CausalLM, geometry: CacheGeometry, limits: WarmupLimits) -> int:
    """Runs a full-budget step into a two-block cache and captures the largest graphs into one, then sizes the
    cache from the memory left free."""
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    probe = KVCache(geometry, 1, device)
    run_reserved_forward(model, probe, limits)
    torch.cuda.synchronize(device)
    step_peak = torch.cuda.max_memory_allocated(device) - before
    del probe
    graph_bytes = profile_graph_bytes(model, geometry, limits.cuda_graph_shapes, device)
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    return cuda_cache_budget(free, step_peak, limits.cuda_memory_fraction, graph_bytes)


def run_reserved_forward(model: CausalLM, cache: KVCache, limits: WarmupLimits) -> None:
    """Runs `max_batch_tokens` dummy tokens whose K/V all land in the reserved block, then samples
    `max_batch_requests` rows."""
    num_tokens, num_samples = limits.max_batch_tokens, limits.max_batch_requests
    num_tokens = max(1, min(num_tokens, model.spec.max_position_embeddings))
    num_blocks = -(-num_tokens // cache.block_size)
    # Every position wraps into the reserved block, so real blocks are never touched.
    span = ScheduledSpan([0] * num_tokens, 0, [cache.reserved_block] * num_blocks)
    device = cache.layers[0].key.device
    batch = build_step_batch([span], cache.block_size, device)
    hidden = forward_step(model, batch, cache.layers)
    rows = torch.arange(num_tokens - min(num_samples, num_tokens), num_tokens, device=device)
    logits = model.compute_logits(hidden[rows])
    vocab_size = logits.shape[-1]
    sampling_rows = [
        SamplingRow(
            _WARMUP_SAMPLING,
            position,
            statistics=TokenStatistics(_WARMUP_SAMPLING, (0, 0), 1, vocab_size, device),
            banned_ids=(0,),
            top_logprobs=1,
        )
        for position in range(len(rows))
    ]
    Sampler()(logits, SamplingBatch.build(sampling_rows, device))


# State checkpoints take at most this share of the KV cache's budget; the blocks get the rest.
STATE_CHECKPOINT_BUDGET_SHARE = 4


def state_checkpoints_for_budget(wanted: int, bytes_per_checkpoint: int, budget_bytes: int) -> int:
    """How many of the `wanted` state checkpoints fit in a quarter of the cache's budget."""
    if wanted < 1 or bytes_per_checkpoint < 1:
        return 0
    return min(wanted, budget_bytes // STATE_CHECKPOINT_BUDGET_SHARE // bytes_per_checkpoint)
