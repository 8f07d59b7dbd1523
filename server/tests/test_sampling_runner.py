"""Sampling through the ModelRunner: seeded determinism across batches and recompute, prompt logprobs, min tokens."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from shard_testing import StepDriver, make_runner, new_request, write_tiny_llama
from tandem_server.engine.model_runner import ModelRunner
from tandem_server.engine.step import Generation, NewRequest, ScheduledRequest, StepInput, StoppingCriteria, WarmupPlan
from tandem_server.sampling import SamplingParams
from transformers import LlamaForCausalLM

PROMPT = [5, 17, 33, 8, 61, 12, 40, 2, 9, 77]
SAMPLING = SamplingParams(
    temperature=0.9, top_p=0.95, min_p=0.02, repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2, seed=7
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LlamaForCausalLM]:
    path = tmp_path_factory.mktemp("tiny-llama-sampling")
    return path, write_tiny_llama(path)


@pytest.fixture
def runner(checkpoint: tuple[Path, LlamaForCausalLM]) -> ModelRunner:
    runner = make_runner(checkpoint[0])
    runner.warmup(WarmupPlan(block_size=4, max_batch_tokens=64, max_batch_requests=8))
    return runner


def test_seeded_request_draws_the_same_tokens_alone_in_a_full_batch_and_after_recompute(runner: ModelRunner) -> None:
    alone = StepDriver(runner, runner.cache.num_blocks, chunk_size=4).run([new_request(1, PROMPT, 8, SAMPLING)])[1]
    others = [
        new_request(10 + i, PROMPT[i:] + PROMPT[:i], 8, replace(SAMPLING, seed=i, typical_p=0.8, top_k=5))
        for i in range(3)
    ]
    full = StepDriver(runner, runner.cache.num_blocks, chunk_size=6, seed=3)
    assert full.run([*others, new_request(2, PROMPT, 8, SAMPLING)])[2] == alone

    partial = StepDriver(runner, runner.cache.num_blocks, chunk_size=4, seed=1)
    partial.step([new_request(3, PROMPT, 8, SAMPLING)])
    while len(partial.tracked[3].generated) < 4:
        partial.step([])
    generated = partial.tracked.pop(3).generated
    runner.step(StepInput(finished=(3,)))
    recompute = new_request(4, PROMPT + generated, 8, SAMPLING, num_output_tokens=4)
    resumed = StepDriver(runner, runner.cache.num_blocks, chunk_size=16, seed=2).run([recompute])[4]
    assert generated + resumed == alone


def test_prompt_logprobs_match_transformers_across_chunked_prefill(
    runner: ModelRunner, checkpoint: tuple[Path, LlamaForCausalLM]
) -> None:
    request = replace(new_request(1, PROMPT, 2), prompt_logprobs=True, top_logprobs=3)
    chunks = [(0, 4, (0,)), (4, 4, (1,)), (8, 2, (2, 3))]
    received: dict[int, float] = {}
    tops = {}
    for start, length, blocks in chunks:
        step = StepInput(
            new_requests=(request,) if start == 0 else (), scheduled=(ScheduledRequest(1, length, blocks, start),)
        )
        for chunk in runner.step(step).prompt_logprobs:
            for offset, logprob in enumerate(chunk.logprobs):
                received[chunk.first_position + offset] = logprob
                tops[chunk.first_position + offset] = chunk.top[offset]
    with torch.no_grad():
        logits = checkpoint[1](torch.tensor([PROMPT])).logits[0]
    reference = torch.log_softmax(logits.float(), dim=-1)
    assert sorted(received) == list(range(1, len(PROMPT)))
    for position, logprob in received.items():
        assert logprob == pytest.approx(reference[position - 1, PROMPT[position]].item(), abs=1e-4)
        assert [t for t, _ in tops[position]] == reference[position - 1].topk(3).indices.tolist()


def _prefill_one(runner: ModelRunner, request: NewRequest) -> Generation:
    step = StepInput(new_requests=(request,), scheduled=(ScheduledRequest(request.id, len(PROMPT), (0, 1, 2), 0),))
    return runner.step(step).generations[0]


def test_min_new_tokens_masks_exactly_the_requests_stop_tokens(runner: ModelRunner) -> None:
    first = _prefill_one(runner, new_request(9, PROMPT))
    runner.reset()
    runner.eos_token_ids = (first.token_id,)
    stopping = StoppingCriteria(8, stop_token_ids=(first.token_id,), min_new_tokens=1)
    generation = _prefill_one(runner, replace(new_request(1, PROMPT), stopping=stopping))
    assert generation.token_id != first.token_id
    assert generation.finish_reason is None
    assert generation.logprob <= first.logprob
    runner.reset()
    # The model's EOS is no stop token of this request (its client ignores EOS): nothing masks it.
    unmasked = _prefill_one(runner, replace(new_request(2, PROMPT), stopping=StoppingCriteria(8, min_new_tokens=1)))
    assert unmasked.token_id == first.token_id
