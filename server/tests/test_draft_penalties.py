"""Speculative decoding for requests with penalties or a logit bias: the draw behind drafts counts them as the
request's own tokens, so outputs (greedy and seeded) are those of the run without drafts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from draft_testing import oracle, run
from shard_testing import make_runner, new_request, warmed, write_tiny_llama
from tandem_server.engine.step import NewRequest, ScheduledRequest, StepInput
from tandem_server.errors import InvalidStepError
from tandem_server.sampling import SamplingParams, SamplingRow
from tandem_server.sampling.penalties import FrequencyPresencePenalty, RepetitionPenalty
from tandem_server.sampling.statistics import TokenStatistics

CPU = torch.device("cpu")
# The tiny model's logits are small: a bias gives the penalties tokens that keep coming back to act on.
BIAS = ((7, 3.0), (61, 2.5), (40, 2.0))
FEATURES = {
    "repetition penalty": SamplingParams(repetition_penalty=1.5, logit_bias=BIAS),
    "frequency penalty": SamplingParams(frequency_penalty=0.5, logit_bias=BIAS),
    "presence penalty": SamplingParams(presence_penalty=2.0, logit_bias=BIAS),
    "logit bias": SamplingParams(logit_bias=BIAS),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("draft-penalties")
    write_tiny_llama(path)
    return path


def _requests(sampling: SamplingParams) -> list[NewRequest]:
    return [
        new_request(1, [5, 20, 21, 22], max_new_tokens=14, sampling=sampling),
        new_request(2, [9, 50, 51, 50, 51], max_new_tokens=12, sampling=replace(sampling, temperature=0.3, seed=17)),
        new_request(3, [9, 50, 51], max_new_tokens=12, sampling=replace(sampling, temperature=0.5, top_p=0.9, seed=4)),
    ]


def _prompts(requests: list[NewRequest]) -> dict[int, int]:
    return {r.id: len(r.token_ids) for r in requests}


@pytest.mark.parametrize("sampling", FEATURES.values(), ids=FEATURES.keys())
def test_right_drafts_are_all_kept_and_change_nothing(checkpoint: Path, sampling: SamplingParams) -> None:
    requests = _requests(sampling)
    reference = run(warmed(make_runner(checkpoint)), requests, drafter=None)
    drafted = run(warmed(make_runner(checkpoint)), requests, drafter=oracle(reference.tokens, _prompts(requests)))
    assert drafted.tokens == reference.tokens
    assert drafted.accepted == drafted.drafted > 0
    assert drafted.steps < reference.steps / 2, (drafted.steps, reference.steps)


@pytest.mark.parametrize("sampling", FEATURES.values(), ids=FEATURES.keys())
def test_wrong_drafts_are_refused_at_the_first_difference_and_change_nothing(
    checkpoint: Path, sampling: SamplingParams
) -> None:
    requests = _requests(sampling)
    reference = run(warmed(make_runner(checkpoint)), requests, drafter=None)
    wrong = oracle(reference.tokens, _prompts(requests), wrong_every=3)
    drafted = run(warmed(make_runner(checkpoint)), requests, drafter=wrong)
    assert drafted.tokens == reference.tokens
    assert 0 < drafted.accepted < drafted.drafted


@pytest.mark.parametrize("sampling", FEATURES.values(), ids=FEATURES.keys())
def test_drafts_of_the_shards_draft_model_change_nothing(checkpoint: Path, sampling: SamplingParams) -> None:
    # The model drafting for itself proposes its unpenalised greedy tokens: some kept, some refused.
    requests = _requests(sampling)
    reference = run(warmed(make_runner(checkpoint)), requests, drafter=None)
    drafted = run(warmed(make_runner(checkpoint, draft_path=checkpoint)), requests, drafter=None, model_drafts=4)
    assert drafted.tokens == reference.tokens
    assert drafted.accepted > 0


@pytest.mark.parametrize("sampling", [None, FEATURES["frequency penalty"]], ids=["plain", "penalised"])
def test_no_request_drafts_behind_a_pending_token(checkpoint: Path, sampling: SamplingParams | None) -> None:
    # Penalties count a pending token on the device, so a penalised request's pending token stays pending too.
    runner = warmed(make_runner(checkpoint))
    runner.options = replace(runner.options, launch_ahead=True)
    request = new_request(1, [5, 20, 21, 22], max_new_tokens=8, sampling=sampling)
    runner.launch(StepInput(new_requests=(request,), scheduled=(ScheduledRequest(1, 4, (0, 1, 2, 3), 0),)))
    with pytest.raises(InvalidStepError, match="that token must be known"):
        runner.launch(StepInput(scheduled=(ScheduledRequest(1, 1, (), 4, (3, 4)),)))


def test_penalties_count_the_drafts_before_each_row_on_top_of_the_request_statistics() -> None:
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=1.0, presence_penalty=0.5)
    statistics = TokenStatistics(params, [1, 2, 3, 3], prompt_len=2, vocab_size=8, device=CPU)
    rows = [
        SamplingRow(params, 4 + len(drafted), statistics=statistics, drafted=drafted) for drafted in [(), (5,), (5, 3)]
    ]
    seen = RepetitionPenalty(rows, CPU).seen
    counts = FrequencyPresencePenalty(rows, CPU).counts
    assert [row.nonzero().flatten().tolist() for row in seen] == [[1, 2, 3], [1, 2, 3, 5], [1, 2, 3, 5]]
    assert counts[:, 3].tolist() == [2.0, 2.0, 3.0] and counts[:, 5].tolist() == [0.0, 1.0, 1.0]
    # The request's own vectors are untouched: drafts become its tokens only once kept.
    assert statistics.seen is not None and statistics.output_counts is not None
    assert statistics.seen.nonzero().flatten().tolist() == [1, 2, 3] and statistics.output_counts[5] == 0
