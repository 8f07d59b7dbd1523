"""Every supported family matches transformers over the paged cache: logits of mixed steps and greedy tokens."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from shard_testing import StepDriver, load_tiny_model, make_runner, new_request, write_tiny_checkpoint
from tandem_server.engine.batch import ScheduledSpan, build_step_batch
from tandem_server.engine.kv_cache import CacheGeometry, KVCache
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

# float32 on CPU: differences come only from summation order.
LOGITS_ATOL = 1e-4
BLOCK_SIZE = 4
# Windows are shorter than the test sequences (up to 24 positions), so they change every later token.
WINDOW = 4

FAMILIES: dict[str, tuple[type, type, dict[str, Any]]] = {
    "qwen2-tied-sliding-upper-layers": (
        Qwen2Config,
        Qwen2ForCausalLM,
        {
            "num_hidden_layers": 3,
            "tie_word_embeddings": True,
            "use_sliding_window": True,
            "sliding_window": WINDOW,
            "max_window_layers": 1,
        },
    ),
    "qwen3-untied": (
        Qwen3Config,
        Qwen3ForCausalLM,
        {"head_dim": 24, "tie_word_embeddings": False, "rope_parameters": {"rope_type": "default", "rope_theta": 1e5}},
    ),
    # transformers' Gemma 3 ignores attn_logit_softcapping, so attention soft-capping is checked in the backend test.
    "gemma3-local-global-softcap": (
        Gemma3TextConfig,
        Gemma3ForCausalLM,
        {
            "num_hidden_layers": 3,
            "head_dim": 16,
            "num_key_value_heads": 1,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "sliding_window": WINDOW,
            "query_pre_attn_scalar": 24,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
            },
            "final_logit_softcapping": 3.0,
        },
    ),
    "gemma3-untied-pattern": (
        Gemma3TextConfig,
        Gemma3ForCausalLM,
        {
            "num_hidden_layers": 2,
            "head_dim": 16,
            "sliding_window": WINDOW + 1,
            "sliding_window_pattern": 2,
            "tie_word_embeddings": False,
        },
    ),
    "phi3-partial-rotary-sliding": (
        Phi3Config,
        Phi3ForCausalLM,
        {"sliding_window": WINDOW, "partial_rotary_factor": 0.5, "tie_word_embeddings": False},
    ),
    "mistral-sliding": (
        MistralConfig,
        MistralForCausalLM,
        {"sliding_window": WINDOW, "head_dim": 8, "tie_word_embeddings": False},
    ),
}

SEQUENCE_LENGTHS = {"A": 10, "B": 13, "C": 7}
# (request, first position, number of tokens): whole prompts, chunks at offsets past the window, decodes.
SCHEDULE = [
    [("A", 0, 7), ("B", 0, 6)],
    [("B", 6, 5), ("A", 7, 1)],
    [("A", 8, 1), ("B", 11, 1), ("C", 0, 5)],
    [("C", 5, 1), ("A", 9, 1), ("B", 12, 1)],
    [("C", 6, 1)],
]


def write_family(path: Path, family: str) -> torch.nn.Module:
    config_class, model_class, overrides = FAMILIES[family]
    return write_tiny_checkpoint(path, config_class, model_class, **overrides)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_mixed_steps_match_transformers_logits(tmp_path: Path, family: str) -> None:
    reference = write_family(tmp_path, family)
    model = load_tiny_model(tmp_path)
    rng = random.Random(1)
    sequences = {name: [rng.randrange(3, 96) for _ in range(n)] for name, n in SEQUENCE_LENGTHS.items()}
    with torch.no_grad():
        expected = {name: reference(torch.tensor([ids])).logits[0] for name, ids in sequences.items()}

    spec = model.spec
    geometry = CacheGeometry(spec.num_layers, BLOCK_SIZE, spec.num_kv_heads, spec.head_dim, torch.float32)
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
                torch.testing.assert_close(got, want, atol=LOGITS_ATOL, rtol=0, msg=f"{family} {name}@{start}")
                row += num_tokens


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_generation_matches_transformers_generate(tmp_path: Path, family: str) -> None:
    reference = write_family(tmp_path, family)
    runner = make_runner(tmp_path)
    runner.warmup(block_size=BLOCK_SIZE, max_batch_tokens=64, max_batch_requests=8)
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 96) for _ in range(length)] for length in (9, 3, 14, 6)]
    max_new_tokens = 10

    driver = StepDriver(runner, num_blocks=runner.cache.num_blocks, chunk_size=5, seed=3)
    ours = driver.run([new_request(i, p, max_new_tokens) for i, p in enumerate(prompts)])

    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            output = reference.generate(
                torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=2
            )
        expected = output[0, len(prompt) :].tolist()
        assert ours[i] == expected, f"{family} prompt {i}"
    assert len(runner.requests) == 0
