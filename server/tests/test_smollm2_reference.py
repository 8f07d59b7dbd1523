"""The embedded SmolLM2-135M-Instruct weights: our shard matches transformers on the same converted checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from shard_testing import StepDriver, make_runner, new_request
from tandem_launcher.config import DEFAULT_MODEL_CACHE_DIR
from tandem_launcher.embedded import converted_model_dir, embedded_gguf
from tandem_server.engine.step import WarmupPlan
from tandem_server.execution.batch import ScheduledSpan, build_step_batch
from tandem_server.execution.eager import forward_step
from transformers import AutoModelForCausalLM, AutoTokenizer

# float32 on CPU over 30 layers: differences come only from summation order.
LOGITS_ATOL = 2e-3
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
    "Water boils at a temperature of",
]


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    return converted_model_dir(embedded_gguf(), DEFAULT_MODEL_CACHE_DIR)


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> AutoModelForCausalLM:
    return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompt_ids(checkpoint: Path) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    return [tokenizer(prompt)["input_ids"] for prompt in PROMPTS]


def test_full_prompt_logits_match_transformers(checkpoint: Path, reference, prompt_ids: list[list[int]]) -> None:
    runner = make_runner(checkpoint, kv_cache_memory=64 * 1024 * 1024)
    runner.warmup(WarmupPlan(block_size=16, max_batch_tokens=64, max_batch_requests=8))
    model = runner.model
    cache = runner.cache
    assert cache is not None
    for prompt in prompt_ids:
        with torch.no_grad():
            expected = reference(torch.tensor([prompt])).logits[0]
        blocks = list(range(-(-len(prompt) // 16)))
        batch = build_step_batch([ScheduledSpan(prompt, 0, blocks)], 16, torch.device("cpu"))
        with torch.inference_mode():
            logits = model.compute_logits(forward_step(model, batch, cache.layers))
        torch.testing.assert_close(logits, expected, atol=LOGITS_ATOL, rtol=0)


def test_greedy_tokens_equal_transformers_generate(checkpoint: Path, reference, prompt_ids: list[list[int]]) -> None:
    runner = make_runner(checkpoint, kv_cache_memory=64 * 1024 * 1024)
    runner.warmup(WarmupPlan(block_size=16, max_batch_tokens=64, max_batch_requests=8))
    max_new_tokens = 16
    driver = StepDriver(runner, num_blocks=runner.cache.num_blocks, chunk_size=64, seed=5)
    eos = runner.eos_token_ids
    ours = driver.run([new_request(i, ids, max_new_tokens, stop_token_ids=eos) for i, ids in enumerate(prompt_ids)])
    for i, prompt in enumerate(prompt_ids):
        with torch.no_grad():
            output = reference.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False)
        expected = output[0, len(prompt) :].tolist()
        assert ours[i] == expected[: len(ours[i])], PROMPTS[i]
        assert len(ours[i]) == max_new_tokens or ours[i][-1] in eos
