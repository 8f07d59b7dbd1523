"""One tensor-parallel rank for the two-process tests; kept free of transformers so spawned ranks start fast."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from tandem_server.config import CompileMode
from tandem_server.distributed import GroupAddress, ParallelContext, init_distributed, shutdown_distributed
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.engine.step import NewRequest, ScheduledRequest, StepInput, StoppingCriteria, WarmupPlan
from tandem_server.execution.batch import ScheduledSpan, build_step_batch
from tandem_server.execution.compiled_decode import CompiledExecutor
from tandem_server.execution.compiled_layers import compile_layers
from tandem_server.execution.eager import forward_step
from tandem_server.execution.kv_cache import CacheGeometry, KVCache
from tandem_server.layers.attention import TorchAttentionBackend
from tandem_server.layers.moe.experts import RoutedExperts
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.loader import load_model
from tandem_server.models.registry import CausalLM
from tandem_server.quant.mode import QuantizeMode
from tandem_server.quant.quantize import quantize_model
from tandem_server.sampling import SamplingParams
from tandem_server.weights.gguf_format import has_gguf_blocks

WORLD_SIZE = 2
BLOCK_SIZE = 4
PROMPT = [5, 17, 33, 8, 61, 12, 40, 9, 71]
NEW_TOKENS = 12
GREEDY = SamplingParams()
SEEDED = SamplingParams(temperature=0.9, top_k=20, seed=7)
# A checkpoint whose directory name starts with this runs its layers compiled, as --torch-compile does.
COMPILED_PREFIX = "compiled-"
# A checkpoint whose directory name holds this runs with its routed experts split across ranks (--expert-parallel).
EXPERTS_SPLIT = "experts-split-"


@torch.inference_mode()
def prompt_logits(model: CausalLM) -> torch.Tensor:
    """Logits of every prompt position, computed through a paged cache with non-contiguous blocks."""
    geometry = CacheGeometry.of(model.spec, BLOCK_SIZE, torch.float32)
    cache = KVCache(geometry, num_blocks=4, device=torch.device("cpu"))
    batch = build_step_batch([ScheduledSpan(PROMPT, 0, [2, 0, 3])], BLOCK_SIZE, torch.device("cpu"))
    return model.compute_logits(forward_step(model, batch, cache.layers))


def generate(model: CausalLM, eos_token_ids: tuple[int, ...], compiled: bool = False) -> dict[int, list[int]]:
    """Tokens of a greedy request (id 1) and a seeded sampled one (id 2) decoded together through ModelRunner."""
    return decode_two_requests(generation_runner(model, eos_token_ids, compiled))


def generation_runner(model: CausalLM, eos_token_ids: tuple[int, ...], compiled: bool = False) -> ModelRunner:
    """A warmed-up CPU runner of `model`, its layers compiled when `compiled`."""
    options = ExecutionOptions(
        kv_cache_memory=1 << 20, compile_mode=CompileMode.WARMUP if compiled else CompileMode.OFF
    )
    runner = ModelRunner(model, eos_token_ids, torch.float32, torch.device("cpu"), options)
    runner.warmup(WarmupPlan(BLOCK_SIZE, max_batch_tokens=64, max_batch_requests=4))
    return runner


def decode_two_requests(runner: ModelRunner) -> dict[int, list[int]]:
    """What `generate` returns, through a runner of the caller's."""
    blocks_per_request = -(-(len(PROMPT) + NEW_TOKENS) // BLOCK_SIZE)
    requests = {
        rid: NewRequest(rid, tuple(PROMPT), 0, sampling, StoppingCriteria(NEW_TOKENS))
        for rid, sampling in ((1, GREEDY), (2, SEEDED))
    }
    tables = {rid: tuple(range((rid - 1) * blocks_per_request, rid * blocks_per_request)) for rid in requests}
    tokens: dict[int, list[int]] = {rid: [] for rid in requests}
    step = StepInput(
        new_requests=tuple(requests.values()),
        scheduled=tuple(ScheduledRequest(rid, len(PROMPT), tables[rid], 0) for rid in requests),
    )
    while step.scheduled:
        for generation in runner.step(step).generations:
            tokens[generation.id].append(generation.token_id)
        running = [rid for rid in requests if len(tokens[rid]) < NEW_TOKENS]
        step = StepInput(
            scheduled=tuple(ScheduledRequest(rid, 1, (), len(PROMPT) + len(tokens[rid]) - 1) for rid in running)
        )
    return tokens


def run_checkpoint(checkpoint: Path, parallel: ParallelContext) -> dict[str, object]:
    """Everything the tests compare across world sizes for one checkpoint."""
    config = read_checkpoint_config(checkpoint)
    if EXPERTS_SPLIT in checkpoint.name:
        parallel = dataclasses.replace(parallel, expert_parallel=True)
    # A converted GGUF checkpoint is served from its kept blocks, as `--quantize gguf` does.
    quantized = has_gguf_blocks(checkpoint)
    compiled = checkpoint.name.startswith(COMPILED_PREFIX)
    # Compiled, decode steps attend through the decode mirror, so they run as whole-step graphs.
    backend = TorchAttentionBackend(decode_mirror_memory=1 << 20 if compiled else 0)
    model = load_model(config, torch.float32, torch.device("cpu"), parallel, backend, gguf_blocks=quantized)
    quantize_model(model, QuantizeMode.GGUF if quantized else QuantizeMode.NONE)
    if compiled:
        compile_layers(model)
    logits = prompt_logits(model)
    runner = generation_runner(model, config.eos_token_ids, compiled)
    return {
        "num_kv_heads": model.spec.num_kv_heads,
        "routed_expert_weights": sum(
            module.parameter_count() for module in model.modules() if isinstance(module, RoutedExperts)
        ),
        "logits": logits,
        "tokens": decode_two_requests(runner),
        "decode_graph_steps": compiled.graph.steps if (compiled := runner.execution.executor(CompiledExecutor)) else 0,
    }


def run_rank(rank: int, checkpoints: list[Path], port: int, out_dir: Path) -> None:
    """Runs every checkpoint on this rank and saves the results to `out_dir/rank{rank}.pt`."""
    torch.set_num_threads(1)
    parallel = init_distributed(rank, WORLD_SIZE, GroupAddress("127.0.0.1", port), "cpu")
    try:
        results = {checkpoint.name: run_checkpoint(checkpoint, parallel) for checkpoint in checkpoints}
        torch.save(results, out_dir / f"rank{rank}.pt")
    finally:
        shutdown_distributed()
