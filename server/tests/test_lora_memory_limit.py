"""`--max-cpu-loras`: only the most recently used adapters keep their weights in memory; a request under another
reads it again from its directory and still gets the merged reference's tokens. An adapter that can no longer be
read fails its own requests alone and stays loaded."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
from lora_testing import EVERYTHING, VALUES, AdapterSpec, greedy, merged, write_adapter
from shard_testing import CPU, StepDriver, load_tiny_model, new_request, warmed, write_tiny_llama
from tandem_server.config import ConfigError, ShardConfig
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.engine.step import NewRequest
from tandem_server.errors import FailureKind
from tandem_server.lora import LoraLimits
from transformers import LlamaForCausalLM

PROMPT = [5, 17, 33, 8, 61, 12, 40, 9, 22]
NEW_TOKENS = 5
SPECS = {
    "values": VALUES,
    "everything": EVERYTHING,
    "gate": AdapterSpec(rank=4, alpha=12, targets=("q_proj", "gate_proj"), seed=3),
}


@dataclasses.dataclass(frozen=True)
class Adapters:
    root: Path
    reference: LlamaForCausalLM
    expected: dict[str, list[int]]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> Adapters:
    root = tmp_path_factory.mktemp("lora-memory")
    reference = write_tiny_llama(root / "model")
    expected = {"": greedy(reference, PROMPT, NEW_TOKENS)[0]}
    for name, spec in SPECS.items():
        directory = write_adapter(root / name, reference, spec)
        expected[name] = greedy(merged(reference, directory, spec), PROMPT, NEW_TOKENS)[0]
    return Adapters(root, reference, expected)


def runner_keeping(adapters: Adapters, max_loras: int, max_cpu_loras: int, directories: dict[str, Path]) -> ModelRunner:
    options = ExecutionOptions(kv_cache_memory=4 * 1024 * 1024, lora=LoraLimits(max_loras, 64, max_cpu_loras))
    runner = warmed(ModelRunner(load_tiny_model(adapters.root / "model"), (2,), torch.float32, CPU, options))
    for name, directory in directories.items():
        runner.lora.load(name, directory)
    return runner


def lora_request(request_id: int, adapter: str) -> NewRequest:
    return dataclasses.replace(new_request(request_id, PROMPT, max_new_tokens=NEW_TOKENS), lora_adapter=adapter)


def run_to_end(runner: ModelRunner, requests: list[NewRequest]) -> StepDriver:
    driver = StepDriver(runner, runner.cache.num_blocks if runner.cache else 0, chunk_size=16)
    driver.step(requests)
    while driver.tracked:
        driver.step([])
    return driver


def test_loading_beyond_the_limit_keeps_the_newest_in_memory_and_lists_every_adapter(adapters: Adapters) -> None:
    runner = runner_keeping(adapters, 1, 2, {name: adapters.root / name for name in SPECS})
    assert [adapter.name for adapter in runner.lora.adapters] == ["values", "everything", "gate"]
    assert runner.lora.resident == ("everything", "gate")
    assert runner.lora.names() == frozenset(SPECS)


def test_each_adapter_read_again_gives_its_merged_references_tokens(adapters: Adapters) -> None:
    runner = runner_keeping(adapters, 1, 2, {name: adapters.root / name for name in SPECS})
    for round_number in range(2):
        for offset, name in enumerate(["values", "gate", "", "everything", "values"]):
            driver = run_to_end(runner, [lora_request(100 * round_number + offset, name)])
            assert driver.done[100 * round_number + offset] == adapters.expected[name], name
            assert len(runner.lora.resident) <= 2
            if name:
                assert runner.lora.resident[-1] == name
    assert len(runner.requests) == 0


def test_a_step_with_as_many_adapters_as_the_limit_keeps_both_and_lets_the_other_go(adapters: Adapters) -> None:
    runner = runner_keeping(adapters, 2, 2, {name: adapters.root / name for name in SPECS})
    driver = run_to_end(runner, [lora_request(1, "values"), lora_request(2, "gate"), lora_request(3, "")])
    assert {request_id: driver.done[request_id] for request_id in (1, 2, 3)} == {
        1: adapters.expected["values"],
        2: adapters.expected["gate"],
        3: adapters.expected[""],
    }
    assert sorted(runner.lora.resident) == ["gate", "values"]


def test_an_adapter_that_cannot_be_read_again_fails_its_requests_alone_and_stays_loaded(
    adapters: Adapters, tmp_path: Path
) -> None:
    doomed = shutil.copytree(adapters.root / "values", tmp_path / "doomed")
    runner = runner_keeping(adapters, 2, 2, {"doomed": doomed, "gate": adapters.root / "gate"})
    runner.lora.load("everything", adapters.root / "everything")
    assert "doomed" not in runner.lora.resident
    shutil.rmtree(doomed)
    driver = run_to_end(runner, [lora_request(1, "doomed"), lora_request(2, "gate"), lora_request(3, "")])
    assert driver.failed[1].kind is FailureKind.ADAPTER_UNAVAILABLE
    assert driver.failed[1].message.startswith(f"LoRA adapter 'doomed' could not be read again from {doomed}: ")
    assert "adapter_config.json" in driver.failed[1].message
    assert (driver.done[2], driver.done[3]) == (adapters.expected["gate"], adapters.expected[""])
    assert "doomed" in runner.lora.names()
    assert len(runner.requests) == 0
    # Restored files serve again.
    shutil.copytree(adapters.root / "values", doomed)
    assert run_to_end(runner, [lora_request(4, "doomed")]).done[4] == adapters.expected["values"]


def test_the_limit_defaults_to_every_start_up_adapter_and_at_least_max_loras(tmp_path: Path) -> None:
    adapters = tuple((f"a{index}", tmp_path / f"a{index}") for index in range(6))
    assert ShardConfig(model_path=tmp_path, uds_path=tmp_path / "s.sock", max_loras=4).lora_memory_limit == 4
    assert (
        ShardConfig(
            model_path=tmp_path, uds_path=tmp_path / "s.sock", max_loras=4, lora_adapters=adapters
        ).lora_memory_limit
        == 6
    )
    assert (
        ShardConfig(model_path=tmp_path, uds_path=tmp_path / "s.sock", max_loras=2, max_cpu_loras=3).lora_memory_limit
        == 3
    )
    with pytest.raises(ConfigError, match=r"--max-cpu-loras 1 is below --max-loras 2"):
        ShardConfig(model_path=tmp_path, uds_path=tmp_path / "s.sock", max_loras=2, max_cpu_loras=1)
    with pytest.raises(ValueError, match="--max-cpu-loras >= --max-loras"):
        LoraLimits(max_loras=2, max_cpu_loras=1)
