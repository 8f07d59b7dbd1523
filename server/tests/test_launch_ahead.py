"""Launching step N+1 before step N's draws are read: the same tokens as one step at a time, penalties count pending
tokens on the device, and a launch on CUDA never waits for the device."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from fake_cuda import FakeCuda
from pipelined_driver import BLOCK_SIZE, PipelinedDriver
from shard_testing import load_tiny_model, make_runner, new_request, warmed, write_tiny_llama
from tandem_server.engine.launched import LaunchedStep
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.engine.step import NewRequest, StepInput, WarmupPlan
from tandem_server.layers.attention import SdpaAttentionBackend
from tandem_server.lora import LoraLimits
from tandem_server.sampling import SamplingParams


def _requests(eos: tuple[int, ...]) -> list[NewRequest]:
    seeded = SamplingParams(temperature=0.9, top_p=0.9, seed=11)
    return [
        new_request(1, [5, 20, 21, 22], max_new_tokens=9),
        new_request(2, [7, *range(30, 43)], max_new_tokens=7, sampling=seeded),
        # Stops at its first EOS, which the pipelined router learns only after planning its next token.
        new_request(3, [9, 50, 51], max_new_tokens=12, stop_token_ids=eos),
        new_request(4, [11, 60, 61, 62, 63], max_new_tokens=6, sampling=replace(seeded, seed=4)),
    ]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("launch_ahead")
    write_tiny_llama(path)
    return path


def _run(checkpoint: Path, launch_ahead: bool, requests: list[NewRequest]) -> tuple[dict[int, list[int]], int]:
    runner = warmed(make_runner(checkpoint))
    runner.options = replace(runner.options, launch_ahead=launch_ahead)
    driver = PipelinedDriver(runner, requests, blocks_per_request=12)
    return driver.run(), driver.overlapped


def test_launching_ahead_gives_the_tokens_of_one_step_at_a_time(checkpoint: Path) -> None:
    eos = tuple(make_runner(checkpoint).eos_token_ids) or (2,)
    requests = _requests(eos)
    one_at_a_time, overlapped_off = _run(checkpoint, launch_ahead=False, requests=requests)
    ahead, overlapped_on = _run(checkpoint, launch_ahead=True, requests=requests)
    assert ahead == one_at_a_time
    assert [len(tokens) for tokens in ahead.values()][:2] == [9, 7]
    assert overlapped_off == 0
    assert overlapped_on > 10, "most steps launched while the step before was open"


def test_a_request_that_ends_in_the_open_step_gets_no_token_from_the_next(checkpoint: Path) -> None:
    # Every token is a stop token: the request ends with its first draw, while its second is already launched.
    stop_everything = tuple(range(make_runner(checkpoint).model.spec.vocab_size))
    requests = [new_request(1, [5, 20, 21], max_new_tokens=5, stop_token_ids=stop_everything)]
    ahead, _ = _run(checkpoint, launch_ahead=True, requests=requests)
    one_at_a_time, _ = _run(checkpoint, launch_ahead=False, requests=requests)
    assert len(ahead[1]) == 1
    assert ahead == one_at_a_time


def test_penalised_requests_launch_ahead_and_count_their_pending_tokens_on_the_device(checkpoint: Path) -> None:
    penalised = SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.3)
    seeded = replace(penalised, temperature=0.9, seed=8)
    requests = [
        new_request(1, [5, 20, 21, 22], max_new_tokens=9, sampling=penalised),
        new_request(2, [6, 30, 31], max_new_tokens=9, sampling=seeded),
    ]
    ahead, overlapped = _run(checkpoint, launch_ahead=True, requests=requests)
    one_at_a_time, _ = _run(checkpoint, launch_ahead=False, requests=requests)
    assert ahead == one_at_a_time
    assert overlapped > 5, "a penalised draw need not reach the host before the next step's penalties use it"


def test_a_launch_on_cuda_queues_its_copies_without_waiting_for_the_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tiny_llama(tmp_path)
    model = load_tiny_model(tmp_path, backend=SdpaAttentionBackend())
    fake = FakeCuda(free_bytes=2 * 1024 * 1024)
    fake.install(monkeypatch)
    device = torch.device("cuda", 0)
    # No LoRA slots: the fake device's 2 MiB would not hold them beside the cache.
    options = ExecutionOptions(cuda_memory_fraction=0.5, launch_ahead=True, lora=LoraLimits(max_loras=0))
    runner = ModelRunner(model, (2,), torch.float32, device, options=options)
    seeded = SamplingParams(temperature=0.7, seed=3)
    requests = [new_request(1, [5, 20, 21, 22, 23], sampling=seeded), new_request(2, [6, 30, 31])]
    driver = PipelinedDriver(runner, requests, blocks_per_request=6)
    launches: list[list[str]] = []
    launch = runner.launch

    def recorded_launch(step: StepInput) -> LaunchedStep:
        fake.calls.clear()
        launched = launch(step)
        launches.append([call.name for call in fake.calls])
        return launched

    def serve() -> None:
        # On a worker thread, as the model thread runs it: the fake places that thread's CUDA tensors on the CPU.
        runner.warmup(WarmupPlan(block_size=BLOCK_SIZE, max_batch_tokens=32, max_batch_requests=4))
        runner.launch = recorded_launch  # type: ignore[method-assign]
        driver.run()

    with ThreadPoolExecutor(max_workers=1) as worker:
        worker.submit(serve).result()
    assert driver.overlapped > 0
    copies = [name for names in launches for name in names if name.endswith("host copy")]
    assert "async host copy" in copies
    assert "blocking host copy" not in copies, launches
    waits = {name for names in launches for name in names if "synchronize" in name}
    assert not waits, f"a launch waited for the device: {waits}"
