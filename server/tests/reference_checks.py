"""Checks shared by the per-family numerics tests: our shard against the transformers reference."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from shard_testing import CPU, StepDriver, load_tiny_model, make_runner, new_request
from tandem_server.engine.model_runner import ModelRunner
from tandem_server.engine.step import WarmupPlan
from tandem_server.execution.batch import ScheduledSpan, build_step_batch
from tandem_server.execution.compiled_layers import compile_layers
from tandem_server.execution.eager import forward_step
from tandem_server.execution.kv_cache import CacheGeometry, KVCache
from tandem_server.layers.attention import AttentionBackend, TorchAttentionBackend

# float32 on CPU: differences come only from summation order.
LOGITS_ATOL = 1e-4
BLOCK_SIZE = 4

SEQUENCE_LENGTHS = {"A": 10, "B": 13, "C": 7}
# Each step lists (request, first position, number of tokens): whole prompts, chunks at offsets, decodes.
SCHEDULE = [
    [("A", 0, 7), ("B", 0, 6)],
    [("B", 6, 5), ("A", 7, 1)],
    [("A", 8, 1), ("B", 11, 1), ("C", 0, 5)],
    [("C", 5, 1), ("A", 9, 1), ("B", 12, 1)],
    [("C", 6, 1)],
]


# Below float32 the bound is relative to transformers' own error in that dtype: on the tiny models (logits ~5) the
# reference cast to bfloat16 is off its float32 forward by up to 0.22, ours by up to 1.2x that (CPU, measured).
LOW_PRECISION_ERROR_FACTOR = 2.0
LOW_PRECISION_ATOL = 0.02


@dataclass(frozen=True)
class Target:
    """Where our model runs and how close its logits must come to the float32 reference."""

    device: torch.device = CPU
    dtype: torch.dtype = torch.float32
    backend: AttentionBackend = field(default_factory=TorchAttentionBackend)
    # The layers' stages compiled, as --torch-compile does.
    compiled: bool = False

    def bounds(self, reference: torch.nn.Module, sequences: dict[str, list[int]]) -> dict[str, float]:
        """Largest allowed |logit difference| per sequence: float32 is exact up to summation order; a lower
        precision may err LOW_PRECISION_ERROR_FACTOR times as much as the reference itself in that dtype."""
        if self.dtype == torch.float32:
            return dict.fromkeys(sequences, LOGITS_ATOL)
        low = copy.deepcopy(reference).to(self.dtype)
        with torch.no_grad():
            return {
                name: LOW_PRECISION_ERROR_FACTOR * _max_difference(low, reference, ids) + LOW_PRECISION_ATOL
                for name, ids in sequences.items()
            }


def _max_difference(model: torch.nn.Module, reference: torch.nn.Module, ids: list[int]) -> float:
    tokens = torch.tensor([ids])
    return (model(tokens).logits.float() - reference(tokens).logits).abs().max().item()


ReferenceLogits = Callable[[torch.nn.Module, list[int]], torch.Tensor]


def whole_sequence_logits(reference: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """The reference's logits `[tokens, vocab]` of one forward pass over the whole sequence."""
    return reference(torch.tensor([ids])).logits[0]


def assert_mixed_steps_match_logits(
    checkpoint: Path,
    reference: torch.nn.Module,
    label: str,
    target: Target | None = None,
    reference_logits: ReferenceLogits = whole_sequence_logits,
) -> None:
    """Runs SCHEDULE over shuffled paged blocks and compares every token's logits with the reference's (by default
    a forward pass over the whole sequence)."""
    target = target or Target()
    model = load_tiny_model(checkpoint, target.device, target.dtype, target.backend)
    if target.compiled:
        compile_layers(model)
    rng = random.Random(1)
    sequences = {name: [rng.randrange(3, 96) for _ in range(n)] for name, n in SEQUENCE_LENGTHS.items()}
    with torch.no_grad():
        expected = {name: reference_logits(reference, ids) for name, ids in sequences.items()}
    bounds = target.bounds(reference, sequences)

    spec = model.spec
    geometry = CacheGeometry.of(spec, BLOCK_SIZE, target.dtype)
    cache = KVCache(geometry, num_blocks=24, device=target.device)
    shuffled = list(range(24))
    rng.shuffle(shuffled)
    block_tables = {name: [shuffled.pop() for _ in range(-(-n // BLOCK_SIZE))] for name, n in SEQUENCE_LENGTHS.items()}

    with torch.inference_mode():
        for step in SCHEDULE:
            spans = [ScheduledSpan(sequences[n][s : s + k], s, block_tables[n]) for n, s, k in step]
            batch = build_step_batch(spans, BLOCK_SIZE, target.device)
            hidden = forward_step(model, batch, cache.layers)
            logits = model.compute_logits(hidden).float().cpu()
            row = 0
            for name, start, num_tokens in step:
                want = expected[name][start : start + num_tokens]
                got = logits[row : row + num_tokens]
                error = (got - want).abs().max().item()
                assert error <= bounds[name], f"{label} {name}@{start}: |logit error| {error:.4g} > {bounds[name]:.4g}"
                row += num_tokens


def warm_for_reference(runner: ModelRunner) -> ModelRunner:
    """`runner` warmed up for the reference checks' steps."""
    runner.warmup(WarmupPlan(block_size=BLOCK_SIZE, max_batch_tokens=64, max_batch_requests=8))
    return runner


def assert_greedy_matches_generate(
    checkpoint: Path, reference: Any, label: str, runner: ModelRunner | None = None, **generate_args: Any
) -> None:
    """Staggered, chunked greedy generation through ModelRunner (`runner`, warmed up by `warm_for_reference`; else a
    fresh one) equals transformers' `generate`."""
    runner = runner or warm_for_reference(make_runner(checkpoint))
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 96) for _ in range(length)] for length in (9, 3, 14, 6)]
    max_new_tokens = 10

    driver = StepDriver(runner, num_blocks=runner.cache.num_blocks, chunk_size=5, seed=3)
    # The router sends the model's EOS ids as stop tokens, as `generate` stops on them.
    eos = tuple(runner.eos_token_ids)
    ours = driver.run([new_request(i, p, max_new_tokens, stop_token_ids=eos) for i, p in enumerate(prompts)])

    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            output = reference.generate(
                torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, **generate_args
            )
        assert ours[i] == output[0, len(prompt) :].tolist(), f"{label} prompt {i}"
    assert len(runner.requests) == 0
