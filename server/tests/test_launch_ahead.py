"""Launching step N+1 before step N's draws are read: the same tokens as one step at a time, requests that need
their tokens on the host complete the open step first, and a launch on CUDA never waits for the device."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import torch
from fake_cuda import FakeCuda
from shard_testing import load_tiny_model, make_runner, new_request, warmed, write_tiny_llama
from tandem_server.engine.launched import LaunchedStep
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.engine.step import NewRequest, ScheduledRequest, StepInput, StepOutput, WarmupPlan
from tandem_server.layers.attention import SdpaAttentionBackend
from tandem_server.sampling import SamplingParams

BLOCK_SIZE = 4
CHUNK = 6


@dataclass
class _Planned:
    """What a router knows of one request: tokens it scheduled, and how many of its draws are still unanswered."""

    request: NewRequest
    num_computed: int = 0
    next_block: int = 0
    blocks_held: int = 0
    unanswered: int = 0
    generated: list[int] = field(default_factory=list)
    done: bool = False

    @property
    def known_tokens(self) -> int:
        return len(self.request.token_ids) + len(self.generated) + self.unanswered


class PipelinedDriver:
    """Plans step N+1 before step N has answered, as the router does with two steps in flight (test-only): a
    decoding request is scheduled again on the token its previous step is still sampling."""

    def __init__(self, runner: ModelRunner, requests: list[NewRequest], blocks_per_request: int) -> None:
        self.runner = runner
        self.planned = {
            request.id: _Planned(request, next_block=index * blocks_per_request)
            for index, request in enumerate(requests)
        }
        self.step_id = 0
        # Steps whose launch found the step before them still open.
        self.overlapped = 0

    def run(self) -> dict[int, list[int]]:
        open_step: LaunchedStep | None = None
        while True:
            step = self._plan()
            if step is None:
                if open_step is None:
                    return {rid: planned.generated for rid, planned in self.planned.items()}
                self._apply(self.runner.complete(open_step))
                open_step = None
                continue
            launched = self.runner.launch(step)
            if open_step is not None:
                self.overlapped += open_step.outcome is None
                self._apply(self.runner.complete(open_step))
            open_step = launched

    def _plan(self) -> StepInput | None:
        new_requests, scheduled = [], []
        for planned in self.planned.values():
            max_new = planned.request.stopping.max_new_tokens
            if planned.done or len(planned.generated) + planned.unanswered >= max_new:
                continue
            if planned.num_computed == 0 and planned.blocks_held == 0:
                new_requests.append(planned.request)
            num_tokens = min(CHUNK, planned.known_tokens - planned.num_computed)
            needed = -(-(planned.num_computed + num_tokens + 1) // BLOCK_SIZE) - planned.blocks_held
            first = planned.next_block + planned.blocks_held
            blocks = tuple(range(first, first + needed))
            planned.blocks_held += needed
            scheduled.append(ScheduledRequest(planned.request.id, num_tokens, blocks, planned.num_computed))
            planned.num_computed += num_tokens
            planned.unanswered += planned.num_computed == planned.known_tokens
        if not scheduled:
            return None
        self.step_id += 1
        return StepInput(new_requests=tuple(new_requests), scheduled=tuple(scheduled))

    def _apply(self, output: StepOutput) -> None:
        assert output.failures == ()
        for generation in output.generations:
            planned = self.planned[generation.id]
            planned.unanswered -= 1
            planned.generated.append(generation.token_id)
            if generation.finish_reason is not None:
                planned.done = True


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


def test_penalties_complete_the_open_step_before_the_next_launch(checkpoint: Path) -> None:
    penalised = SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5)
    requests = [new_request(1, [5, 20, 21, 22], max_new_tokens=6, sampling=penalised)]
    ahead, overlapped = _run(checkpoint, launch_ahead=True, requests=requests)
    one_at_a_time, _ = _run(checkpoint, launch_ahead=False, requests=requests)
    assert ahead == one_at_a_time
    assert overlapped == 0, "each penalised draw was read before the next step's penalty vectors were used"


def test_a_launch_on_cuda_queues_its_copies_without_waiting_for_the_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tiny_llama(tmp_path)
    model = load_tiny_model(tmp_path, backend=SdpaAttentionBackend())
    fake = FakeCuda(free_bytes=2 * 1024 * 1024)
    fake.install(monkeypatch)
    device = torch.device("cuda", 0)
    options = ExecutionOptions(cuda_memory_fraction=0.5, launch_ahead=True)
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
