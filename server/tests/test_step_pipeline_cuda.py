"""The CUDA step pipeline on the fake runtime's ordered stream log: a step's draws leave the device before the next
step's forward pass is queued, a launch never copies from pageable memory nor waits, and seeded sampling queues
the same work whatever the batch size."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest
import torch
from fake_cuda import FakeCuda
from pipelined_driver import BLOCK_SIZE, PipelinedDriver
from shard_testing import load_tiny_model, new_request, write_tiny_llama
from tandem_server.device_copy import to_device
from tandem_server.engine.launched import LaunchedStep
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.engine.step import NewRequest, StepInput, WarmupPlan
from tandem_server.layers.attention import SdpaAttentionBackend
from tandem_server.lora import LoraLimits
from tandem_server.sampling import Sampler, SamplingBatch, SamplingParams, SamplingRow

CUDA = torch.device("cuda", 0)
Result = TypeVar("Result")
SEEDED = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, seed=3)
PENALISED = SamplingParams(temperature=0.8, seed=5, repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2)


def _on_worker(job: Callable[[], Result]) -> Result:
    # The fake places a thread's CUDA tensors on the CPU from that thread's first CUDA call, as the model thread's.
    with ThreadPoolExecutor(max_workers=1) as worker:
        return worker.submit(job).result()


def _logged_runner(checkpoint: Path, fake: FakeCuda, launch_ahead: bool) -> ModelRunner:
    """A runner on the fake `cuda:0` whose launches and forward passes mark the stream log; decode steps of one and
    two requests replay captured graphs, as on a GPU by default."""
    model = load_tiny_model(checkpoint, backend=SdpaAttentionBackend())
    # No LoRA slots: the fake device's 2 MiB would not hold them beside the cache.
    lora = LoraLimits(max_loras=0)
    options = ExecutionOptions(cuda_memory_fraction=0.5, cuda_graph_sizes=(1, 2), launch_ahead=launch_ahead, lora=lora)
    runner = ModelRunner(model, (2,), torch.float32, CUDA, options=options)
    forward, launch = model.forward, runner.launch

    def logged_forward(*args: object, **kwargs: object) -> torch.Tensor:
        fake.record("forward")
        return forward(*args, **kwargs)

    def logged_launch(step: StepInput) -> LaunchedStep:
        fake.record("launch")
        launched = launch(step)
        fake.record("launched")
        return launched

    model.forward = logged_forward  # type: ignore[method-assign]
    runner.launch = logged_launch  # type: ignore[method-assign]
    return runner


def _serve(
    checkpoint: Path, fake: FakeCuda, requests: list[NewRequest], launch_ahead: bool = True
) -> tuple[dict[int, list[int]], int]:
    def serve() -> tuple[dict[int, list[int]], int]:
        runner = _logged_runner(checkpoint, fake, launch_ahead)
        runner.warmup(WarmupPlan(block_size=BLOCK_SIZE, max_batch_tokens=32, max_batch_requests=4))
        fake.calls.clear()
        driver = PipelinedDriver(runner, requests, blocks_per_request=8)
        return driver.run(), driver.overlapped

    return _on_worker(serve)


def _launches(names: list[str]) -> list[list[str]]:
    """The log between each launch's start and end."""
    spans, current = [], None
    for name in names:
        if name == "launch":
            current = []
        elif name == "launched":
            assert current is not None
            spans.append(current)
            current = None
        elif current is not None:
            current.append(name)
    return spans


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    write_tiny_llama(tmp_path)
    return tmp_path


def test_each_step_s_draws_leave_the_device_before_the_next_forward_is_queued(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeCuda(free_bytes=2 * 1024 * 1024)
    fake.install(monkeypatch)
    requests = [new_request(1, [5, 20, 21, 22, 23], max_new_tokens=6, sampling=SEEDED), new_request(2, [6, 30, 31])]
    _, overlapped = _serve(checkpoint, fake, requests)
    names = fake.names()
    assert overlapped > 3
    assert "blocking device copy" not in names, "a step's draws were read with a copy that waits for the device"
    launches = _launches(names)
    forwards = [span for span in launches if {"forward", "CUDAGraph.replay"} & set(span)]
    assert len(forwards) >= overlapped
    assert any("CUDAGraph.replay" in span for span in forwards), "decode steps replayed their graphs"
    for span in forwards:
        # Queued within its own launch: after its forward pass, before the launch returns, so before the next
        # launch queues its forward pass; the event marks the copy's end for `complete` to wait on.
        forward = next(index for index, name in enumerate(span) if name in ("forward", "CUDAGraph.replay"))
        copy = span.index("async device copy")
        assert forward < copy < len(span) - span[::-1].index("Event.record") - 1, span


def test_a_launch_with_sampled_penalised_and_seeded_rows_neither_copies_from_pageable_memory_nor_waits(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = [
        new_request(1, [5, 20, 21, 22], max_new_tokens=7, sampling=PENALISED),
        new_request(2, [7, 30, 31, 32, 33, 34, 35], max_new_tokens=6, sampling=SEEDED),
        new_request(3, [9, 40, 41], max_new_tokens=5),
    ]
    fake = FakeCuda(free_bytes=2 * 1024 * 1024)
    fake.install(monkeypatch)
    one_at_a_time, _ = _serve(checkpoint, fake, requests, launch_ahead=False)
    tokens, overlapped = _serve(checkpoint, fake, requests)
    assert tokens == one_at_a_time
    launches = _launches(fake.names())
    assert overlapped >= len(launches) - 2, "penalised requests launch ahead too"
    for span in launches:
        blocking = [name for name in span if name.startswith("blocking") or "synchronize" in name]
        assert blocking == [], f"a launch waited for the device: {blocking}"
    assert any("async host copy" in span for span in launches)


def _sampler_work(fake: FakeCuda, rows: int) -> list[str]:
    vocab = 512

    def sample() -> list[str]:
        torch.cuda.set_device(CUDA)
        batch_rows = [SamplingRow(params=SEEDED, position=10 + row) for row in range(rows)]
        batch = SamplingBatch.build(batch_rows, CUDA)
        logits = to_device(torch.randn(rows, vocab), CUDA)
        fake.calls.clear()
        Sampler().sample(logits, batch)
        return fake.names()

    return _on_worker(sample)


def test_seeded_sampling_queues_the_same_work_at_any_batch_size(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCuda(free_bytes=2 * 1024 * 1024)
    fake.install(monkeypatch)
    small, large = _sampler_work(fake, 2), _sampler_work(fake, 32)
    assert "Generator" not in small + large, "no generator per row"
    assert small.count("kernel") == large.count("kernel")
    assert not [name for name in small + large if name.startswith("blocking") or "synchronize" in name]
