"""Test helpers: tiny random-weight checkpoints of any family and a minimal block-handing driver for ModelRunner."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tandem_server.config import CompileMode
from tandem_server.distributed import ParallelContext
from tandem_server.engine.companions import Companions
from tandem_server.engine.draft_model import DraftModel
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.engine.step import (
    NewRequest,
    RequestFailure,
    ScheduledRequest,
    StepInput,
    StoppingCriteria,
    WarmupPlan,
)
from tandem_server.execution.background_compile import BackgroundCompile
from tandem_server.execution.compiled_decode import CompiledExecutor, DecodeGraph
from tandem_server.execution.cuda_graphs import CudaGraphExecutor, StepGraphs
from tandem_server.execution.decode_package import DecodePackageSpec
from tandem_server.layers.attention import AttentionBackend, TorchAttentionBackend
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.loader import load_model
from tandem_server.models.registry import CausalLM
from tandem_server.sampling import SamplingParams
from transformers import LlamaConfig, LlamaForCausalLM, PretrainedConfig, PreTrainedModel

CPU = torch.device("cpu")
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}

CHECKPOINT_VARIANTS: dict[str, dict[str, Any]] = {
    "untied-gqa": {"tie_word_embeddings": False, "num_key_value_heads": 2},
    "tied-mha": {"tie_word_embeddings": True, "num_key_value_heads": 4},
    "llama3-rope": {"tie_word_embeddings": True, "num_key_value_heads": 2, "rope_parameters": LLAMA3_ROPE},
}


TINY_SETTINGS: dict[str, Any] = {
    "vocab_size": 96,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "initializer_range": 0.2,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


# Scale of random routing correction biases: comparable to the spread of sigmoid scores, so they change selections.
CORRECTION_BIAS_SCALE = 0.3


def randomize_correction_biases(model: PreTrainedModel) -> None:
    """Random per-expert routing correction biases (grouped routing's init is zero, which would hide a router that
    ignores them)."""
    for name, buffer in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buffer.copy_(torch.randn_like(buffer) * CORRECTION_BIAS_SCALE)


def write_tiny_checkpoint(
    path: Path,
    config_class: type[PretrainedConfig],
    model_class: type[PreTrainedModel],
    seed: int = 0,
    randomize: Callable[[PreTrainedModel], None] | None = None,
    **overrides: Any,
) -> PreTrainedModel:
    """Saves a small random model of `model_class` (safetensors) into `path` and returns it as the reference.

    Norm weights are randomised too (their init is constant), so a norm loaded wrongly cannot go unnoticed;
    `randomize` changes any other tensor whose init would hide a mistake before the model is saved.
    """
    torch.manual_seed(seed)
    config = config_class(**{**TINY_SETTINGS, **overrides})
    config._attn_implementation = "eager"
    # Experts one GEMM pair at a time (transformers' loop), not through the grouped GEMM Tandem's experts call.
    config._experts_implementation = "eager"
    reference = model_class(config).eval()
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.2)
        if randomize is not None:
            randomize(reference)
    reference.save_pretrained(path)
    return reference


def write_tiny_llama(path: Path, seed: int = 0, **overrides: Any) -> LlamaForCausalLM:
    """Saves a 2-layer random Llama (safetensors) into `path` and returns the transformers reference."""
    return write_tiny_checkpoint(path, LlamaConfig, LlamaForCausalLM, seed, **overrides)


def load_tiny_model(
    path: Path,
    device: torch.device = CPU,
    dtype: torch.dtype = torch.float32,
    backend: AttentionBackend | None = None,
) -> CausalLM:
    """Our model for the checkpoint at `path` (float32 on CPU with the torch backend unless told otherwise)."""
    checkpoint = read_checkpoint_config(path)
    return load_model(checkpoint, dtype, device, ParallelContext(), backend or TorchAttentionBackend())


def make_runner(
    path: Path,
    kv_cache_memory: int = 4 * 1024 * 1024,
    decode_mirror_memory: int | None = None,
    kv_cache_dtype: torch.dtype | None = None,
    draft_path: Path | None = None,
    compile_mode: CompileMode = CompileMode.OFF,
    decode_package: DecodePackageSpec | None = None,
) -> ModelRunner:
    """A float32 CPU runner over the checkpoint at `path`, not yet warmed up; as on a CPU shard, the decode mirror
    may take half as much memory as the KV cache unless `decode_mirror_memory` says otherwise. With `draft_path`, the
    checkpoint there proposes drafts; `compile_mode` compiles as --torch-compile does (`background` through the
    `decode_package` given)."""
    checkpoint = read_checkpoint_config(path)
    mirror_memory = kv_cache_memory // 2 if decode_mirror_memory is None else decode_mirror_memory
    model = load_tiny_model(path, backend=TorchAttentionBackend(decode_mirror_memory=mirror_memory))
    options = ExecutionOptions(
        kv_cache_memory=kv_cache_memory,
        kv_cache_dtype=kv_cache_dtype,
        compile_mode=compile_mode,
        decode_package=decode_package,
    )
    draft_model = None
    if draft_path is not None:
        draft = read_checkpoint_config(draft_path)
        draft_model = DraftModel(load_tiny_model(draft_path), draft.architecture, kv_cache_dtype or torch.float32, CPU)
    companions = Companions(draft_model=draft_model)
    return ModelRunner(model, checkpoint.eos_token_ids, torch.float32, CPU, options, companions)


def new_request(
    request_id: int,
    token_ids: list[int],
    max_new_tokens: int = 8,
    sampling: SamplingParams | None = None,
    num_output_tokens: int = 0,
    stop_token_ids: tuple[int, ...] = (),
) -> NewRequest:
    return NewRequest(
        id=request_id,
        token_ids=tuple(token_ids),
        num_output_tokens=num_output_tokens,
        sampling=sampling or SamplingParams(),
        stopping=StoppingCriteria(max_new_tokens=max_new_tokens, stop_token_ids=stop_token_ids),
    )


@dataclass
class _Tracked:
    tokens: list[int]
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)


class StepDriver:
    """Hands out shuffled blocks and schedules chunked prompts and decodes, as a router would (test-only)."""

    def __init__(self, runner: ModelRunner, num_blocks: int, chunk_size: int, seed: int = 0) -> None:
        self.runner = runner
        self.block_size = runner.cache.block_size if runner.cache else 0
        self.free_blocks = list(range(num_blocks))
        random.Random(seed).shuffle(self.free_blocks)
        self.chunk_size = chunk_size
        self.tracked: dict[int, _Tracked] = {}
        self.done: dict[int, list[int]] = {}
        self.failed: dict[int, RequestFailure] = {}

    def step(self, new_requests: list[NewRequest]) -> None:
        for request in new_requests:
            self.tracked[request.id] = _Tracked(tokens=list(request.token_ids))
        scheduled = [self._schedule(rid, state) for rid, state in self.tracked.items()]
        output = self.runner.step(StepInput(new_requests=tuple(new_requests), scheduled=tuple(scheduled)))
        for generation in output.generations:
            state = self.tracked[generation.id]
            state.tokens.append(generation.token_id)
            state.generated.append(generation.token_id)
            if generation.finish_reason is not None:
                self.free_blocks.extend(self.tracked.pop(generation.id).blocks)
                self.done[generation.id] = state.generated
        for failure in output.failures:
            self.free_blocks.extend(self.tracked.pop(failure.id).blocks)
            self.failed[failure.id] = failure

    def run(self, staggered: list[NewRequest]) -> dict[int, list[int]]:
        """Admits one request per step, then steps until every request finished."""
        pending = list(staggered)
        while pending or self.tracked:
            self.step([pending.pop(0)] if pending else [])
        return self.done

    def chunk_len(self, request_id: int, num_computed: int, remaining: int) -> int:
        """The tokens request `request_id` runs next, of the `remaining` after its `num_computed`."""
        return min(self.chunk_size, remaining)

    def _schedule(self, rid: int, state: _Tracked) -> ScheduledRequest:
        num_tokens = self.chunk_len(rid, state.num_computed, len(state.tokens) - state.num_computed)
        needed = -(-(state.num_computed + num_tokens) // self.block_size) - len(state.blocks)
        new_blocks = [self.free_blocks.pop() for _ in range(max(0, needed))]
        state.blocks.extend(new_blocks)
        scheduled = ScheduledRequest(rid, num_tokens, tuple(new_blocks), state.num_computed)
        state.num_computed += num_tokens
        return scheduled


@contextlib.contextmanager
def recorded_logits(runner: ModelRunner) -> Iterator[list[torch.Tensor]]:
    """The logits of every sampling step `runner` runs inside the block, in order."""
    logits: list[torch.Tensor] = []
    compute_logits = runner.model.compute_logits

    def recording(hidden: torch.Tensor) -> torch.Tensor:
        logits.append(compute_logits(hidden))
        return logits[-1]

    runner.model.compute_logits = recording  # type: ignore[method-assign]
    try:
        yield logits
    finally:
        del runner.model.compute_logits


def warmed(runner: ModelRunner) -> ModelRunner:
    """`runner` warmed up for small steps: blocks of 4 tokens, 64 tokens and 8 requests per step."""
    runner.warmup(WarmupPlan(block_size=4, max_batch_tokens=64, max_batch_requests=8))
    return runner


def staggered_decodes(
    runner: ModelRunner, sampling: SamplingParams | None = None
) -> tuple[dict[int, list[int]], list[torch.Tensor]]:
    """Six requests of different lengths join one per step, decode together and finish at different steps; their
    tokens and every step's logits."""
    logits: list[torch.Tensor] = []
    compute_logits = runner.model.compute_logits

    def recording(hidden: torch.Tensor) -> torch.Tensor:
        logits.append(compute_logits(hidden))
        return logits[-1]

    runner.model.compute_logits = recording  # type: ignore[method-assign]
    prompts = [[5 + i, *range(20, 20 + 3 * i + 2)] for i in range(6)]
    eos = tuple(runner.eos_token_ids)
    requests = [
        new_request(i, prompt, max_new_tokens=6 + 3 * i, sampling=sampling, stop_token_ids=eos)
        for i, prompt in enumerate(prompts)
    ]
    done = StepDriver(runner, runner.cache.num_blocks, chunk_size=5).run(requests)
    return done, logits


def decode_graph(runner: ModelRunner) -> DecodeGraph | None:
    """The runner's compiled decode graph, under --torch-compile."""
    compiled = runner.execution.executor(CompiledExecutor)
    return compiled.graph if compiled is not None else None


def background_compile(runner: ModelRunner) -> BackgroundCompile | None:
    """The runner's background compile, while one was started at the latest Warmup."""
    compiled = runner.execution.executor(CompiledExecutor)
    return compiled.background if compiled is not None else None


def step_graphs(runner: ModelRunner) -> StepGraphs | None:
    """The runner's captured CUDA graphs."""
    executor = runner.execution.executor(CudaGraphExecutor)
    return executor.graphs if executor is not None else None
