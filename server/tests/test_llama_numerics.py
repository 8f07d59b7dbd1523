"""Our Llama forward over the paged cache matches transformers for mixed chunked/decode steps."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from shard_testing import CHECKPOINT_VARIANTS, StepDriver, load_tiny_model, make_runner, new_request, write_tiny_llama
from tandem_server.engine.batch import ScheduledSpan, build_step_batch
from tandem_server.engine.kv_cache import CacheGeometry, KVCache

# float32 on CPU: differences come only from summation order.
LOGITS_ATOL = 1e-4
BLOCK_SIZE = 4

# Each step lists (request, first position, number of tokens); requests' full sequences are fixed up front.
SEQUENCE_LENGTHS = {"A": 10, "B": 13, "C": 7}
SCHEDULE = [
    [("A", 0, 7), ("B", 0, 6)],
    [("B", 6, 5), ("A", 7, 1)],
    [("A", 8, 1), ("B", 11, 1), ("C", 0, 5)],
    [("C", 5, 1), ("A", 9, 1), ("B", 12, 1)],
    [("C", 6, 1)],
]


@pytest.mark.parametrize("variant", sorted(CHECKPOINT_VARIANTS))
def test_mixed_steps_match_transformers_logits(tmp_path: Path, variant: str) -> None:
    reference = write_tiny_llama(tmp_path, **CHECKPOINT_VARIANTS[variant])
    model = load_tiny_model(tmp_path)
    rng = random.Random(1)
    sequences = {name: [rng.randrange(3, 96) for _ in range(n)] for name, n in SEQUENCE_LENGTHS.items()}
    with torch.no_grad():
        expected = {name: reference(torch.tensor([ids])).logits[0] for name, ids in sequences.items()}

    geometry = CacheGeometry(2, BLOCK_SIZE, model.spec.num_kv_heads, model.spec.head_dim, torch.float32)
    cache = KVCache(geometry, num_blocks=24, device=torch.device("cpu"))
    shuffled = list(range(24))
    rng.shuffle(shuffled)
    block_tables = {name: [shuffled.pop() for _ in range(-(-n // BLOCK_SIZE))] for name, n in SEQUENCE_LENGTHS.items()}

    with torch.inference_mode():
        for step in SCHEDULE:
            spans = [ScheduledSpan(sequences[n][s : s + k], s, block_tables[n]) for n, s, k in step]
            batch = build_step_batch(spans, BLOCK_SIZE, torch.device("cpu"))
            logits = model.compute_logits(model(batch.input_ids, batch.positions, cache.layers, batch.metadata))
            row = 0
            for name, start, num_tokens in step:
                want = expected[name][start : start + num_tokens]
                got = logits[row : row + num_tokens]
                torch.testing.assert_close(got, want, atol=LOGITS_ATOL, rtol=0, msg=f"{variant} {name}@{start}")
                row += num_tokens


@pytest.mark.parametrize("variant", sorted(CHECKPOINT_VARIANTS))
def test_greedy_generation_matches_transformers_generate(tmp_path: Path, variant: str) -> None:
    reference = write_tiny_llama(tmp_path, **CHECKPOINT_VARIANTS[variant])
    runner = make_runner(tmp_path)
    runner.warmup(block_size=BLOCK_SIZE, max_batch_tokens=64, max_batch_requests=8)
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 96) for _ in range(length)] for length in (9, 3, 14, 6)]
    max_new_tokens = 10

    driver = StepDriver(runner, num_blocks=runner.cache.num_blocks, chunk_size=5, seed=3)
    ours = driver.run([new_request(i, p, max_new_tokens) for i, p in enumerate(prompts)])

    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            output = reference.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False)
        assert ours[i] == output[0, len(prompt) :].tolist(), f"prompt {i}"
    assert len(runner.requests) == 0
