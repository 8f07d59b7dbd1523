"""LoRA adapters through the real engine: each adapter's greedy tokens and logits equal transformers with the adapter
merged into the weights, one step mixes base rows and several adapters, and base rows stay bit-identical."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from draft_testing import oracle
from draft_testing import run as run_with_drafts
from lora_testing import EVERYTHING, VALUES, AdapterSpec, greedy, merged, write_adapter
from shard_testing import (
    CPU,
    StepDriver,
    load_tiny_model,
    make_runner,
    new_request,
    recorded_logits,
    warmed,
    write_tiny_llama,
)
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.engine.step import NewRequest
from tandem_server.errors import FailureKind, InvalidStepError
from tandem_server.lora import LoraLimits
from transformers import LlamaForCausalLM

PROMPT = [5, 17, 33, 8, 61, 12, 40, 9, 22]
NEW_TOKENS = 6
ADAPTERS = {
    "values": VALUES,
    "everything": EVERYTHING,
    # One layer of two, the query and the gate projections: a target regex as PEFT writes one.
    "late": AdapterSpec(
        rank=4,
        alpha=12,
        targets=("q_proj", "gate_proj"),
        layers=(1,),
        seed=3,
        config={"target_modules": r".*\.1\.(self_attn\.q_proj|mlp\.gate_proj)"},
    ),
}


@dataclasses.dataclass(frozen=True)
class Served:
    root: Path
    runner: ModelRunner
    reference: LlamaForCausalLM
    merged: dict[str, LlamaForCausalLM]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Served:
    root = tmp_path_factory.mktemp("lora")
    reference = write_tiny_llama(root / "model")
    runner = warmed(make_runner(root / "model"))
    references = {}
    for name, spec in ADAPTERS.items():
        directory = write_adapter(root / name, reference, spec)
        runner.lora.load(name, directory)
        references[name] = merged(reference, directory, spec)
    return Served(root, runner, reference, references)


def lora_request(request_id: int, adapter: str, prompt: list[int] = PROMPT) -> NewRequest:
    return dataclasses.replace(new_request(request_id, prompt, max_new_tokens=NEW_TOKENS), lora_adapter=adapter)


def run_recording_logits(
    runner: ModelRunner, requests: list[NewRequest], chunk_size: int
) -> tuple[dict[int, list[int]], list[torch.Tensor]]:
    """Every request admitted in the first step; the tokens of each and the logits of every sampling step."""
    with recorded_logits(runner) as logits:
        driver = StepDriver(runner, runner.cache.num_blocks if runner.cache else 0, chunk_size)
        driver.step(requests)
        while driver.tracked:
            driver.step([])
    assert not driver.failed
    return driver.done, logits


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_each_adapter_generates_the_merged_references_tokens_and_logits(served: Served, adapter: str) -> None:
    expected_tokens, expected_logits = greedy(served.merged[adapter], PROMPT, NEW_TOKENS)
    base_tokens, _ = greedy(served.reference, PROMPT, NEW_TOKENS)
    done, logits = run_recording_logits(served.runner, [lora_request(1, adapter)], chunk_size=4)
    assert done[1] == expected_tokens
    assert expected_tokens != base_tokens, "the adapter must change the tokens for this test to see it"
    torch.testing.assert_close(torch.cat(logits), torch.stack(expected_logits), rtol=1e-4, atol=1e-4)


def test_one_step_mixing_base_rows_and_two_adapters_gives_each_row_its_own_reference(served: Served) -> None:
    references = [served.reference, served.merged["values"], served.merged["everything"], served.merged["values"]]
    prompts = [PROMPT, PROMPT, PROMPT[::-1], PROMPT[2:] + PROMPT[:2]]
    requests = [
        lora_request(10, "", prompts[0]),
        lora_request(11, "values", prompts[1]),
        lora_request(12, "everything", prompts[2]),
        lora_request(13, "values", prompts[3]),
    ]
    done, logits = run_recording_logits(served.runner, requests, chunk_size=16)
    for index, (request, reference, prompt) in enumerate(zip(requests, references, prompts, strict=True)):
        expected_tokens, expected_logits = greedy(reference, prompt, NEW_TOKENS)
        assert done[request.id] == expected_tokens
        # Every request samples in every step, in scheduled order.
        own = torch.stack([step_logits[index] for step_logits in logits])
        torch.testing.assert_close(own, torch.stack(expected_logits), rtol=1e-4, atol=1e-4)


def test_base_rows_beside_adapter_rows_are_bit_identical_to_an_all_base_step(served: Served) -> None:
    _, beside_adapter = run_recording_logits(
        served.runner, [lora_request(20, ""), lora_request(21, "everything")], chunk_size=16
    )
    _, all_base = run_recording_logits(served.runner, [lora_request(22, ""), lora_request(23, "")], chunk_size=16)
    assert all(torch.equal(mixed[0], base[0]) for mixed, base in zip(beside_adapter, all_base, strict=True))


def test_steps_without_adapter_rows_match_a_runner_that_never_loaded_an_adapter_bit_for_bit(
    served: Served, tmp_path: Path
) -> None:
    write_tiny_llama(tmp_path / "model")
    plain = warmed(make_runner(tmp_path / "model"))
    requests = [lora_request(30, ""), lora_request(31, "", PROMPT[::-1])]
    _, with_adapters_loaded = run_recording_logits(served.runner, requests, chunk_size=4)
    _, without = run_recording_logits(plain, requests, chunk_size=4)
    assert all(torch.equal(a, b) for a, b in zip(with_adapters_loaded, without, strict=True))


def test_a_request_naming_an_unknown_adapter_fails_alone(served: Served) -> None:
    driver = StepDriver(served.runner, served.runner.cache.num_blocks if served.runner.cache else 0, chunk_size=16)
    driver.step([lora_request(40, "values"), lora_request(41, "no-such-adapter")])
    while driver.tracked:
        driver.step([])
    assert driver.failed[41].kind is FailureKind.INVALID_PARAMETERS
    assert driver.failed[41].message == "unknown LoRA adapter 'no-such-adapter'"
    assert driver.done[40] == greedy(served.merged["values"], PROMPT, NEW_TOKENS)[0]


def test_a_step_running_more_adapters_than_max_loras_is_refused_before_any_state_changes(served: Served) -> None:
    options = ExecutionOptions(kv_cache_memory=4 * 1024 * 1024, lora=LoraLimits(max_loras=2))
    runner = warmed(ModelRunner(load_tiny_model(served.root / "model"), (2,), torch.float32, CPU, options))
    for name in ADAPTERS:
        runner.lora.load(name, served.root / name)
    driver = StepDriver(runner, runner.cache.num_blocks if runner.cache else 0, chunk_size=16)
    with pytest.raises(InvalidStepError, match=r"runs 3 LoRA adapters .* at most 2 in one step \(--max-loras\)"):
        driver.step([lora_request(50 + i, name) for i, name in enumerate(ADAPTERS)])
    assert len(runner.requests) == 0
    # Two adapters and base rows in one step are within the limit.
    driver = StepDriver(runner, runner.cache.num_blocks if runner.cache else 0, chunk_size=16)
    driver.step([lora_request(60, "values"), lora_request(61, "late"), lora_request(62, "")])
    assert len(runner.requests) == 3


def test_a_running_request_whose_adapter_is_unloaded_fails_alone(served: Served) -> None:
    runner = served.runner
    runner.lora.load("transient", served.root / "values")
    driver = StepDriver(runner, runner.cache.num_blocks if runner.cache else 0, chunk_size=16)
    driver.step([lora_request(70, "transient"), lora_request(71, "values")])
    runner.lora.unload("transient")
    while driver.tracked:
        driver.step([])
    assert driver.failed[70].kind is FailureKind.INVALID_PARAMETERS
    assert driver.failed[70].message == "LoRA adapter 'transient' was unloaded while the request ran"
    assert driver.done[71] == greedy(served.merged["values"], PROMPT, NEW_TOKENS)[0]


def test_drafts_verified_under_an_adapter_keep_the_adapters_greedy_tokens(served: Served) -> None:
    requests = [lora_request(80, ""), lora_request(81, "everything", PROMPT[::-1])]
    expected = {
        80: greedy(served.reference, PROMPT, NEW_TOKENS)[0],
        81: greedy(served.merged["everything"], PROMPT[::-1], NEW_TOKENS)[0],
    }
    # Every other draft is wrong: some drafts are kept, the others rejected, under the adapter and without it.
    drafter = oracle(expected, {request.id: len(request.token_ids) for request in requests}, wrong_every=2)
    outcome = run_with_drafts(served.runner, requests, drafter)
    assert outcome.tokens == expected
    assert 0 < outcome.accepted < outcome.drafted
