"""Speculative decoding on the shard: drafts run in one forward pass with the request's last token, each kept while
it equals the draw the request makes at its position, so outputs (greedy and seeded) never change."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from draft_testing import VOCAB_SIZE, greedy_and_seeded_requests, oracle, run
from shard_testing import make_runner, new_request, warmed, write_tiny_llama
from tandem_server.engine.step import NewRequest, ScheduledRequest, StepInput, StoppingCriteria
from tandem_server.errors import InvalidStepError
from tandem_server.sampling import SamplingParams


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("drafts")
    write_tiny_llama(path)
    return path


def _prompts(requests: list[NewRequest]) -> dict[int, int]:
    return {r.id: len(r.token_ids) for r in requests}


def test_right_drafts_are_all_kept_and_change_nothing(checkpoint: Path) -> None:
    requests = greedy_and_seeded_requests()
    reference = run(warmed(make_runner(checkpoint)), requests, drafter=None)
    drafted = run(warmed(make_runner(checkpoint)), requests, drafter=oracle(reference.tokens, _prompts(requests)))
    assert drafted.tokens == reference.tokens
    assert drafted.accepted == drafted.drafted > 0
    assert drafted.steps < reference.steps / 2, (drafted.steps, reference.steps)
    for rid, logprobs in reference.logprobs.items():
        assert drafted.logprobs[rid] == pytest.approx(logprobs, abs=1e-4)


def test_wrong_drafts_are_refused_at_the_first_difference_and_change_nothing(checkpoint: Path) -> None:
    requests = greedy_and_seeded_requests()
    reference = run(warmed(make_runner(checkpoint)), requests, drafter=None)
    prompts = _prompts(requests)
    wrong = run(warmed(make_runner(checkpoint)), requests, drafter=oracle(reference.tokens, prompts, wrong_every=2))
    assert wrong.tokens == reference.tokens
    assert 0 < wrong.accepted < wrong.drafted


def test_seeded_draws_are_the_same_with_drafts_for_every_seed(checkpoint: Path) -> None:
    # Each draw is a function of (seed, position) and the logits, so the output distribution is the target's.
    requests = [
        new_request(seed, [5 + seed % 7, 20, 21], max_new_tokens=8, sampling=SamplingParams(temperature=1.0, seed=seed))
        for seed in range(1, 13)
    ]
    reference = run(warmed(make_runner(checkpoint)), requests, drafter=None)
    half_right = oracle(reference.tokens, _prompts(requests), wrong_every=3)
    drafted = run(warmed(make_runner(checkpoint)), requests, drafter=half_right)
    assert drafted.tokens == reference.tokens
    assert drafted.accepted > 0


def test_a_kept_draft_that_is_a_stop_token_ends_the_request_there(checkpoint: Path) -> None:
    requests = [new_request(1, [5, 20, 21, 22], max_new_tokens=12)]
    reference = run(warmed(make_runner(checkpoint)), requests, drafter=None)
    stop = reference.tokens[1][3]
    stopping = StoppingCriteria(max_new_tokens=12, stop_token_ids=(stop,))
    stopped = [replace(requests[0], stopping=stopping)]
    expected = run(warmed(make_runner(checkpoint)), stopped, drafter=None)
    drafted = run(warmed(make_runner(checkpoint)), stopped, drafter=oracle(reference.tokens, _prompts(stopped)))
    assert drafted.tokens == expected.tokens
    assert drafted.tokens[1][-1] == stop


def test_min_tokens_counts_the_drafts_kept_before_each_position(checkpoint: Path) -> None:
    requests = [new_request(1, [5, 20, 21, 22], max_new_tokens=10)]
    reference = run(warmed(make_runner(checkpoint)), requests, drafter=None).tokens[1]
    # The first token not seen before it becomes the stop token, allowed from exactly its own position on.
    position = next(i for i in range(2, len(reference)) if reference[i] not in reference[:i])
    assert position <= 4, "the first decode's drafts reach it"
    stopping = StoppingCriteria(max_new_tokens=10, stop_token_ids=(reference[position],), min_new_tokens=position)
    constrained = [replace(requests[0], stopping=stopping)]
    expected = run(warmed(make_runner(checkpoint)), constrained, drafter=None)
    assert expected.tokens[1] == reference[: position + 1]
    # The first decode drafts the stop token behind drafts it keeps: only those make it allowed.
    drafted = run(warmed(make_runner(checkpoint)), constrained, drafter=oracle({1: reference}, _prompts(requests)))
    assert drafted.tokens == expected.tokens
    assert drafted.steps == 2


@pytest.mark.parametrize(
    ("prompt_logprobs", "drafts"),
    [(True, (3,)), (False, (VOCAB_SIZE + 5,))],
    ids=["prompt logprobs", "draft outside the vocabulary"],
)
def test_drafts_the_shard_cannot_verify_are_refused(checkpoint: Path, prompt_logprobs: bool, drafts: tuple) -> None:
    runner = warmed(make_runner(checkpoint))
    request = replace(new_request(1, [5, 20, 21]), prompt_logprobs=prompt_logprobs)
    runner.step(StepInput(new_requests=(request,), scheduled=(ScheduledRequest(1, 3, (0, 1), 0),)))
    with pytest.raises(InvalidStepError, match="draft"):
        runner.step(StepInput(scheduled=(ScheduledRequest(1, 1, (), 3, drafts),)))
