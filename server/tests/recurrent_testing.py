"""The numerics checks every hybrid family runs against transformers: mixed steps carrying recurrent state through a
paged cache and a state pool, and greedy requests that finish apart and hand their state slots on."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from shard_testing import StepDriver, make_runner, new_request
from tandem_server.engine.step import StepInput, WarmupPlan
from tandem_server.execution.batch import ScheduledSpan, build_step_batch
from tandem_server.execution.eager import run_prepared
from tandem_server.execution.kv_cache import CacheGeometry, KVCache
from tandem_server.execution.protocol import PlannedStep
from tandem_server.layers.recurrent.state_pool import RecurrentStatePool
from tandem_server.models.registry import CausalLM
from transformers import PreTrainedModel

CPU = torch.device("cpu")
# One step's spans: (sequence, first position, tokens).
Schedule = Sequence[Sequence[tuple[str, int, int]]]


def assert_mixed_steps_match_logits(
    reference: PreTrainedModel,
    model: CausalLM,
    lengths: Mapping[str, int],
    schedule: Schedule,
    block_size: int,
    atol: float,
    label: str = "",
) -> None:
    """Runs `schedule` through shuffled cache blocks and a pool of as many state slots as sequences; every span's
    logits stay within `atol` of the reference's over the whole sequence."""
    rng = random.Random(1)
    sequences = {seq: [rng.randrange(3, 96) for _ in range(n)] for seq, n in lengths.items()}
    with torch.no_grad():
        expected = {seq: reference(torch.tensor([ids])).logits[0] for seq, ids in sequences.items()}
    num_blocks = sum(-(-n // block_size) for n in lengths.values())
    cache = KVCache(CacheGeometry.of(model.spec, block_size, torch.float32), num_blocks=num_blocks, device=CPU)
    blocks = list(range(num_blocks))
    rng.shuffle(blocks)
    tables = {seq: [blocks.pop() for _ in range(-(-n // block_size))] for seq, n in lengths.items()}
    request_ids = {seq: i for i, seq in enumerate(lengths)}
    pool = RecurrentStatePool(model.spec.state_shapes, len(lengths), torch.float32, CPU, model.spec.state_dtypes)
    with torch.inference_mode():
        for step in schedule:
            spans = [ScheduledSpan(sequences[n][s : s + k], s, tables[n], request_ids[n]) for n, s, k in step]
            batch = build_step_batch(spans, block_size, CPU)
            states = pool.place([(request_ids[n], s, k) for n, s, k in step])
            logits = model.compute_logits(run_prepared(model, PlannedStep(batch, cache.layers, model.backend, states)))
            row = 0
            for seq, start, num_tokens in step:
                error = (logits[row : row + num_tokens] - expected[seq][start : start + num_tokens]).abs().max()
                assert error.item() <= atol, f"{label} {seq}@{start}: |logit error| {error.item():.4g}"
                row += num_tokens


def assert_requests_pass_their_slots_on(
    reference: PreTrainedModel,
    checkpoint: Path,
    lengths: Sequence[int],
    budgets: Sequence[int],
    block_size: int,
    chunk_size: int,
) -> None:
    """Serves all requests but the last with one state slot each, then the last in the slot a finished one gave
    back; each request's greedy tokens equal `generate`'s, and no slot is held at the end."""
    runner = make_runner(checkpoint)
    slots = len(lengths) - 1
    runner.warmup(WarmupPlan(block_size=block_size, max_batch_tokens=256, max_batch_requests=slots))
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 96) for _ in range(n)] for n in lengths]
    requests = [new_request(i, p, budget) for i, (p, budget) in enumerate(zip(prompts, budgets, strict=True))]
    driver = StepDriver(runner, num_blocks=runner.cache.num_blocks, chunk_size=chunk_size, seed=3)
    driver.step(requests[:slots])
    while not driver.done:
        driver.step([])
    assert runner.execution.states is not None and runner.execution.states.held == slots
    driver.step([requests[slots]])
    while driver.tracked:
        driver.step([])
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            output = reference.generate(
                torch.tensor([prompt]), max_new_tokens=budgets[i], do_sample=False, eos_token_id=None
            )
        assert driver.done[i] == output[0, len(prompt) :].tolist(), f"request {i}"
    runner.step(StepInput())
    assert runner.execution.states.held == 0
