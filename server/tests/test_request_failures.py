"""A request that cannot go on fails alone: the rest of its Step runs and samples exactly as it would without it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from shard_testing import StepDriver, make_runner, new_request, warmed, write_tiny_llama
from tandem_server.engine.model_runner import ModelRunner
from tandem_server.engine.step import RequestFailure, StepOutput, StoppingCriteria
from tandem_server.errors import FailureKind
from tandem_server.rpc.convert import step_output_to_pb
from tandem_server.rpc.generated import shard_pb2
from tandem_server.sampling import SamplingParams

PROMPT = [5, 17, 33, 8, 61, 12]
VOCAB_SIZE = 96
SAMPLED = SamplingParams(temperature=0.9, top_p=0.8, seed=3)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama-failures")
    write_tiny_llama(path)
    return path


@pytest.fixture
def runner(checkpoint: Path) -> ModelRunner:
    return warmed(make_runner(checkpoint))


def healthy_requests() -> list:
    return [new_request(10, PROMPT, 7), new_request(11, [9, 4, 40], 9, SAMPLED)]


def run_beside(runner: ModelRunner, hostile: list) -> StepDriver:
    driver = StepDriver(runner, runner.cache.num_blocks, chunk_size=4)
    driver.run([*healthy_requests(), *hostile])
    return driver


def alone(runner: ModelRunner) -> dict[int, list[int]]:
    return StepDriver(runner, runner.cache.num_blocks, chunk_size=4).run(healthy_requests())


@pytest.mark.parametrize(
    ("hostile", "message"),
    [
        (new_request(1, [5, VOCAB_SIZE + 3]), f"prompt token id {VOCAB_SIZE + 3}"),
        (new_request(1, PROMPT, sampling=SamplingParams(logit_bias=((VOCAB_SIZE, 5.0),))), "logit_bias token"),
        (
            replace(new_request(1, PROMPT), stopping=StoppingCriteria(max_new_tokens=4, stop_token_ids=(1 << 31,))),
            "stop token",
        ),
    ],
    ids=["prompt", "logit-bias", "stop-token"],
)
def test_a_token_id_outside_the_vocabulary_fails_its_request_alone(
    runner: ModelRunner, hostile: object, message: str
) -> None:
    expected = alone(runner)
    driver = run_beside(runner, [hostile])
    assert driver.done == expected
    assert driver.failed[1].kind is FailureKind.TOKEN_OUT_OF_RANGE
    assert message in driver.failed[1].message
    assert len(runner.requests) == 0


def test_a_sampling_parameter_no_processor_can_use_fails_its_request_alone(runner: ModelRunner) -> None:
    expected = alone(runner)
    hostile = [
        new_request(1, PROMPT, sampling=SamplingParams(temperature=float("nan"), seed=1)),
        new_request(2, PROMPT, sampling=SamplingParams(logit_bias=((3, float("inf")),))),
        new_request(3, PROMPT, sampling=SamplingParams(temperature=1.0, top_p=-0.5)),
    ]
    driver = run_beside(runner, hostile)
    assert driver.done == expected
    assert {rid: failure.kind for rid, failure in driver.failed.items()} == {
        1: FailureKind.INVALID_PARAMETERS,
        2: FailureKind.INVALID_PARAMETERS,
        3: FailureKind.INVALID_PARAMETERS,
    }
    assert "temperature" in driver.failed[1].message


def test_non_finite_logits_in_one_row_fail_that_request_mid_generation(
    runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = alone(runner)
    hostile = new_request(1, [7, 7, 7, 7, 7], 12)
    compute_logits = runner.model.compute_logits
    driver = StepDriver(runner, runner.cache.num_blocks, chunk_size=4)

    def poisoned(hidden: torch.Tensor) -> torch.Tensor:
        logits = compute_logits(hidden)
        tracked = driver.tracked.get(1)
        if tracked is not None and len(tracked.generated) == 3:
            # Sampling rows follow the scheduled order, in which the driver keeps request 1 last.
            logits[-1, 4] = float("nan")
        return logits

    monkeypatch.setattr(runner.model, "compute_logits", poisoned)
    driver.run([*healthy_requests(), hostile])
    assert driver.done == expected
    assert driver.failed[1].kind is FailureKind.NON_FINITE_LOGITS
    assert len(runner.requests) == 0


def test_every_failure_kind_reaches_the_router_as_its_own_contract_value() -> None:
    output = StepOutput(
        generations=(),
        forward_ms=0.0,
        sampling_ms=0.0,
        failures=tuple(RequestFailure(index, kind, kind.value) for index, kind in enumerate(FailureKind)),
    )
    kinds = [failure.kind for failure in step_output_to_pb(output).failures]
    assert shard_pb2.FAILURE_KIND_UNSPECIFIED not in kinds
    assert len(set(kinds)) == len(FailureKind)
    assert kinds[list(FailureKind).index(FailureKind.ADAPTER_UNAVAILABLE)] == shard_pb2.FAILURE_KIND_ADAPTER_UNAVAILABLE
