"""Test-only fault injection: flag parsing, which Steps count, and the servicer failing or hanging on cue."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from shard_testing import make_runner, write_tiny_llama
from tandem_server.cli import config_from_args, main
from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.faults import FaultKind, FaultPlan, FaultTarget, StepFaults, inject_faults
from tandem_server.rpc.generated import shard_pb2, shard_pb2_grpc
from tandem_server.rpc.model_thread import ModelThread
from tandem_server.rpc.server import start_server
from tandem_server.rpc.servicer import EXIT_GROUP_OUT_OF_STEP, ShardServicer, build_info

PROMPT = [5, 17, 33, 8]
BASE_ARGS = ["--model-path", "m", "--uds-path", "s"]


def test_fault_flags_default_to_no_fault() -> None:
    config = config_from_args(BASE_ARGS)
    assert config.faults == FaultPlan()
    assert not StepFaults(config.faults, rank=0).armed


def test_fault_flags_parse_rank_and_step() -> None:
    args = [*BASE_ARGS, "--world-size", "2", "--fault-inject-step-error", "1:7", "--fault-inject-step-hang", " 0 : 3 "]
    config = config_from_args(args)
    assert config.faults == FaultPlan(step_error=FaultTarget(1, 7), step_hang=FaultTarget(0, 3))


@pytest.mark.parametrize("value", ["7", "0:0", "a:1", "0:-1", "0:1:2", ""])
def test_malformed_fault_targets_are_config_errors(value: str) -> None:
    with pytest.raises(ConfigError, match=r"--fault-inject-step-error expects RANK:STEP with STEP >= 1"):
        config_from_args([*BASE_ARGS, "--fault-inject-step-error", value])


def test_a_fault_for_a_rank_outside_the_group_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE_ARGS, "--fault-inject-step-hang", "1:2"]) == 2
    assert "--fault-inject-step-hang names rank 1, outside world size 1" in capsys.readouterr().err


def test_only_steps_with_scheduled_requests_count() -> None:
    faults = StepFaults(FaultPlan(step_error=FaultTarget(0, 2)), rank=0)
    assert faults.armed
    assert faults.on_step(0) is None  # registers or forgets requests only: no forward pass
    assert faults.on_step(3) is None
    assert faults.on_step(0) is None
    assert faults.on_step(1) is FaultKind.ERROR
    assert [faults.on_step(1) for _ in range(5)] == [None] * 5, "the fault fires once per process"


def test_other_ranks_ignore_the_fault() -> None:
    faults = StepFaults(FaultPlan(step_error=FaultTarget(1, 1), step_hang=FaultTarget(1, 2)), rank=0)
    assert not faults.armed
    assert [faults.on_step(1) for _ in range(3)] == [None] * 3


def test_hang_wins_when_both_faults_name_the_same_step() -> None:
    faults = StepFaults(FaultPlan(step_error=FaultTarget(0, 1), step_hang=FaultTarget(0, 1)), rank=0)
    assert faults.on_step(2) is FaultKind.HANG


def step(request_id: int, *, new: bool, step_id: int = 0) -> shard_pb2.StepRequest:
    """A one-request Step: the prompt's prefill when `new`, else one decode token."""
    if new:
        request = shard_pb2.NewRequest(
            id=request_id,
            token_ids=PROMPT,
            sampling=shard_pb2.SamplingParameters(temperature=0.0),
            stopping=shard_pb2.StoppingCriteria(max_new_tokens=4),
        )
        scheduled = shard_pb2.ScheduledRequest(id=request_id, num_tokens=len(PROMPT), new_block_ids=[1])
        return shard_pb2.StepRequest(step_id=step_id, new_requests=[request], scheduled=[scheduled])
    scheduled = shard_pb2.ScheduledRequest(id=request_id, num_tokens=1, new_block_ids=[2], num_computed_tokens=4)
    return shard_pb2.StepRequest(step_id=step_id, scheduled=[scheduled])


# How long one model job may run before Health reports the shard stalled, in the hang test.
STALL_AFTER_S = 1.5

Scenario = Callable[[shard_pb2_grpc.ShardServiceStub], Awaitable[None]]


def serve(
    tmp_path: Path, plan: FaultPlan, scenario: Scenario, world_size: int = 1, step_timeout_s: float | None = None
) -> None:
    """Runs `scenario` against a warmed-up servicer over a real Unix socket, with `plan`'s faults; a `world_size`
    above 1 only changes what the servicer believes (no process group is joined)."""
    write_tiny_llama(tmp_path / "model")
    runner = make_runner(tmp_path / "model")
    info = build_info(runner, "LlamaForCausalLM", "torch", ParallelContext())
    info.world_size = world_size
    socket_path = tmp_path / "shard.sock"

    async def run() -> None:
        faulty = inject_faults(runner, plan, info.rank)
        servicer = ShardServicer(faulty or runner, info, model_thread=ModelThread(step_timeout_s, runner.device))
        server = await start_server(servicer, socket_path)
        try:
            async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
                stub = shard_pb2_grpc.ShardServiceStub(channel)
                await stub.Warmup(shard_pb2.WarmupRequest(block_size=4, max_batch_tokens=16, max_batch_requests=2))
                await scenario(stub)
        finally:
            servicer.shut_down()
            if faulty is not None:
                faulty.release()
            await server.stop(0)

    asyncio.run(run())


def test_injected_step_error_fails_that_step_with_internal_then_the_shard_serves_on(tmp_path: Path) -> None:
    async def scenario(stub: shard_pb2_grpc.ShardServiceStub) -> None:
        first = await stub.Step(step(1, new=True))
        assert [generation.id for generation in first.generations] == [1]
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.Step(step(1, new=False, step_id=1))
        assert failed.value.code() == grpc.StatusCode.INTERNAL
        assert failed.value.details() == (
            "injected fault: rank 0 fails its forward pass in step 2 (--fault-inject-step-error)"
        )
        await stub.Health(shard_pb2.HealthRequest(deep=True))
        await stub.Reset(shard_pb2.ResetRequest())
        again = await stub.Step(step(2, new=True))
        assert [generation.id for generation in again.generations] == [2]

    serve(tmp_path, FaultPlan(step_error=FaultTarget(0, 2)), scenario)


def test_an_injected_hang_holds_the_model_until_health_reports_the_shard_stalled(tmp_path: Path) -> None:
    async def scenario(stub: shard_pb2_grpc.ShardServiceStub) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as hung:
            await stub.Step(step(1, new=True), timeout=0.5)
        assert hung.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await stub.Health(shard_pb2.HealthRequest(deep=False), timeout=5.0)
        next_step = stub.Step(step(2, new=True, step_id=1), timeout=5.0)
        for later in (next_step, stub.Reset(shard_pb2.ResetRequest(), timeout=5.0)):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await later
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "still busy" in (refused.value.details() or "")
        await asyncio.sleep(STALL_AFTER_S)
        with pytest.raises(grpc.aio.AioRpcError) as stalled:
            await stub.Health(shard_pb2.HealthRequest(deep=False), timeout=5.0)
        assert stalled.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "--step-timeout" in (stalled.value.details() or "")

    serve(tmp_path, FaultPlan(step_hang=FaultTarget(0, 1)), scenario, step_timeout_s=STALL_AFTER_S)


def test_a_tensor_parallel_rank_exits_after_answering_a_failed_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)

    async def scenario(stub: shard_pb2_grpc.ShardServiceStub) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.Step(step(1, new=True))
        assert "injected fault" in (failed.value.details() or "")
        assert exits == [], "the error is answered before the process leaves"
        await asyncio.sleep(1.0)
        assert exits == [EXIT_GROUP_OUT_OF_STEP]

    serve(tmp_path, FaultPlan(step_error=FaultTarget(0, 1)), scenario, world_size=2)


def test_a_single_rank_stays_up_after_a_failed_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)

    async def scenario(stub: shard_pb2_grpc.ShardServiceStub) -> None:
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.Step(step(1, new=True))
        await asyncio.sleep(1.0)
        assert exits == []

    serve(tmp_path, FaultPlan(step_error=FaultTarget(0, 1)), scenario)
