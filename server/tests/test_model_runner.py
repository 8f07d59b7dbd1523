"""ModelRunner bookkeeping: typed errors for inconsistent steps, stop conditions, recompute after preemption."""

from __future__ import annotations

from pathlib import Path

import pytest
from shard_testing import StepDriver, make_runner, new_request, write_tiny_llama
from tandem_server.engine.model_runner import ModelRunner
from tandem_server.engine.step import (
    FinishReason,
    NewRequest,
    ScheduledRequest,
    StepInput,
    StoppingCriteria,
    WarmupPlan,
)
from tandem_server.errors import InvalidStepError, NotWarmedUpError, StateMismatchError
from tandem_server.sampling import SamplingParams

PROMPT = [5, 17, 33, 8, 61, 12]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    write_tiny_llama(path)
    return path


@pytest.fixture
def runner(checkpoint: Path) -> ModelRunner:
    runner = make_runner(checkpoint)
    runner.warmup(WarmupPlan(block_size=4, max_batch_tokens=32, max_batch_requests=4))
    return runner


def prefill(request: NewRequest, blocks: tuple[int, ...] = (3, 1)) -> StepInput:
    return StepInput(
        new_requests=(request,), scheduled=(ScheduledRequest(request.id, len(request.token_ids), blocks, 0),)
    )


def test_step_before_warmup_is_rejected(checkpoint: Path) -> None:
    with pytest.raises(NotWarmedUpError):
        make_runner(checkpoint).step(prefill(new_request(1, PROMPT)))


def test_warmup_sizes_cache_from_memory_budget(checkpoint: Path) -> None:
    runner = make_runner(checkpoint, kv_cache_memory=1_000_000)
    result = runner.warmup(WarmupPlan(block_size=4, max_batch_tokens=32, max_batch_requests=4))
    bytes_per_block = 2 * 2 * 4 * 2 * 16 * 4  # K and V, layers, block size, kv heads, head dim, float32
    assert result.num_blocks == 1_000_000 // bytes_per_block - 1
    assert result.kv_cache_bytes == (result.num_blocks + 1) * bytes_per_block


def test_duplicate_request_id_is_rejected(runner: ModelRunner) -> None:
    runner.step(prefill(new_request(1, PROMPT)))
    with pytest.raises(InvalidStepError, match="already registered"):
        runner.step(prefill(new_request(1, PROMPT), blocks=(5, 6)))


def test_wrong_num_computed_tokens_is_rejected(runner: ModelRunner) -> None:
    runner.step(prefill(new_request(1, PROMPT)))
    with pytest.raises(StateMismatchError, match="computed"):
        runner.step(StepInput(scheduled=(ScheduledRequest(1, 1, (), 5),)))


def test_too_few_blocks_is_rejected_without_changing_state(runner: ModelRunner) -> None:
    with pytest.raises(InvalidStepError, match="cannot hold"):
        runner.step(prefill(new_request(1, PROMPT), blocks=(3,)))
    assert 1 not in runner.requests


def test_finished_ids_are_forgotten_and_unknown_ones_ignored(runner: ModelRunner) -> None:
    runner.step(prefill(new_request(1, PROMPT)))
    runner.step(StepInput(finished=(1, 999)))
    assert 1 not in runner.requests


def test_mid_prompt_chunk_produces_no_generation(runner: ModelRunner) -> None:
    request = new_request(1, PROMPT)
    output = runner.step(StepInput(new_requests=(request,), scheduled=(ScheduledRequest(1, 4, (0,), 0),)))
    assert output.generations == ()
    output = runner.step(StepInput(scheduled=(ScheduledRequest(1, 2, (2,), 4),)))
    assert [g.id for g in output.generations] == [1]
    assert output.forward_ms > 0 and output.prepare_ms > 0


def first_greedy_token(runner: ModelRunner) -> int:
    output = runner.step(prefill(new_request(100, PROMPT)))
    runner.reset()
    return output.generations[0].token_id


def test_a_request_ends_on_its_stop_tokens_and_never_on_the_models_own_eos(runner: ModelRunner) -> None:
    token = first_greedy_token(runner)
    stop = NewRequest(1, tuple(PROMPT), 0, SamplingParams(), StoppingCriteria(8, stop_token_ids=(token,)))
    assert runner.step(prefill(stop)).generations[0].finish_reason is FinishReason.STOP_TOKEN

    # The router lists the model's EOS among the stop tokens unless the client ignores EOS.
    runner.eos_token_ids = (token,)
    ignoring_eos = new_request(2, PROMPT)
    generation = runner.step(prefill(ignoring_eos, (4, 5))).generations[0]
    assert generation.token_id == token and generation.finish_reason is None
    assert 2 in runner.requests and 1 not in runner.requests


def test_max_new_tokens_counts_tokens_generated_before_preemption(runner: ModelRunner) -> None:
    resumed = new_request(1, PROMPT, max_new_tokens=3, num_output_tokens=2)
    generation = runner.step(prefill(resumed)).generations[0]
    assert generation.finish_reason is FinishReason.LENGTH
    assert 1 not in runner.requests


def test_preempted_request_resumes_with_same_tokens(runner: ModelRunner) -> None:
    sampling = SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=42)
    driver = StepDriver(runner, runner.cache.num_blocks, chunk_size=4)
    uninterrupted = driver.run([new_request(1, PROMPT, max_new_tokens=8, sampling=sampling)])[1]
    assert len(uninterrupted) == 8

    partial = StepDriver(runner, runner.cache.num_blocks, chunk_size=4, seed=1)
    partial.step([new_request(2, PROMPT, max_new_tokens=8, sampling=sampling)])
    while len(partial.tracked[2].generated) < 3:
        partial.step([])
    generated = partial.tracked.pop(2).generated
    runner.step(StepInput(finished=(2,)))
    recompute = new_request(3, PROMPT + generated, max_new_tokens=8, sampling=sampling, num_output_tokens=3)
    resumed = StepDriver(runner, runner.cache.num_blocks, chunk_size=16, seed=2).run([recompute])[3]
    assert generated + resumed == uninterrupted


def test_a_request_the_shard_ended_is_skipped_in_the_next_step_only(runner: ModelRunner) -> None:
    # A router that plans step N+1 before step N answers schedules a request the shard ends in step N.
    both = StepInput(
        new_requests=(new_request(1, PROMPT, max_new_tokens=1), new_request(2, PROMPT)),
        scheduled=(ScheduledRequest(1, len(PROMPT), (3, 1), 0), ScheduledRequest(2, len(PROMPT), (5, 6), 0)),
    )
    runner.step(both)
    planned_early = StepInput(scheduled=(ScheduledRequest(1, 1, (), len(PROMPT)), ScheduledRequest(2, 1, (), 6)))
    output = runner.step(planned_early)
    assert [generation.id for generation in output.generations] == [2]
    with pytest.raises(StateMismatchError, match="unknown"):
        runner.step(StepInput(scheduled=(ScheduledRequest(1, 1, (), len(PROMPT)),)))


def test_a_request_that_failed_on_arrival_is_skipped_in_the_next_step(runner: ModelRunner) -> None:
    out_of_vocabulary = new_request(1, [*PROMPT[:-1], 10_000])
    first_chunk = StepInput(new_requests=(out_of_vocabulary,), scheduled=(ScheduledRequest(1, 3, (3,), 0),))
    assert [failure.id for failure in runner.step(first_chunk).failures] == [1]
    second_chunk = StepInput(scheduled=(ScheduledRequest(1, 3, (1,), 3),))
    assert runner.step(second_chunk).generations == ()


def test_forward_gap_is_the_time_between_two_forward_passes(runner: ModelRunner) -> None:
    first = runner.step(prefill(new_request(1, PROMPT)))
    assert first.forward_gap_ms == 0.0
    second = runner.step(StepInput(scheduled=(ScheduledRequest(1, 1, (), len(PROMPT)),)))
    assert 0.0 < second.forward_gap_ms
    runner.reset()
    assert runner.step(prefill(new_request(2, PROMPT))).forward_gap_ms == 0.0
