"""The servicer over a real Unix socket: Info, Warmup, Step (prefill + decode), Health, Reset, mapped errors; Health
during a long Warmup."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import grpc
import pytest
from shard_testing import make_runner, write_tiny_llama
from tandem_server.distributed import ParallelContext
from tandem_server.engine.step import WarmupPlan, WarmupResult
from tandem_server.metrics import CompilationState
from tandem_server.rpc import convert
from tandem_server.rpc.generated import shard_pb2, shard_pb2_grpc
from tandem_server.rpc.model_thread import ModelThread
from tandem_server.rpc.server import start_server
from tandem_server.rpc.servicer import ShardServicer, build_info

PROMPT = [5, 17, 33, 8, 61, 12, 40]


def new_request(request_id: int) -> shard_pb2.NewRequest:
    return shard_pb2.NewRequest(
        id=request_id,
        token_ids=PROMPT,
        sampling=shard_pb2.SamplingParameters(temperature=0.0),
        stopping=shard_pb2.StoppingCriteria(max_new_tokens=2),
    )


async def exercise(stub: shard_pb2_grpc.ShardServiceStub) -> None:
    info = await stub.Info(shard_pb2.InfoRequest())
    assert (info.architecture, info.dtype, info.device) == ("LlamaForCausalLM", "float32", "cpu")
    assert (info.vocab_size, info.num_layers, info.num_kv_heads, info.head_dim) == (96, 2, 2, 16)
    assert list(info.eos_token_ids) == [2] and info.world_size == 1 and info.attention_backend == "torch"

    with pytest.raises(grpc.aio.AioRpcError) as not_warm:
        await stub.Health(shard_pb2.HealthRequest(deep=True))
    assert not_warm.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    warm = await stub.Warmup(shard_pb2.WarmupRequest(block_size=4, max_batch_tokens=32, max_batch_requests=4))
    assert warm.num_blocks > 2 and warm.kv_cache_bytes > 0
    await stub.Health(shard_pb2.HealthRequest(deep=True))

    prefill = shard_pb2.StepRequest(
        step_id=1,
        new_requests=[new_request(1)],
        scheduled=[shard_pb2.ScheduledRequest(id=1, num_tokens=len(PROMPT), new_block_ids=[2, 0])],
    )
    first = await stub.Step(prefill)
    assert [g.id for g in first.generations] == [1] and first.generations[0].logprob <= 0
    assert first.generations[0].finish_reason == shard_pb2.FINISH_REASON_UNSPECIFIED
    assert first.forward_ms > 0 and first.prepare_ms > 0
    # This runner compiles nothing.
    assert (first.compilation.decode_rows, first.compilation.compiling) == (0, False)
    # The shard's whole handling contains every part it reports.
    assert first.shard_total_ms >= first.prepare_ms + first.forward_ms + first.sampling_ms

    decode = shard_pb2.StepRequest(
        step_id=2, scheduled=[shard_pb2.ScheduledRequest(id=1, num_tokens=1, new_block_ids=[1], num_computed_tokens=7)]
    )
    second = await stub.Step(decode)
    assert second.generations[0].finish_reason == shard_pb2.FINISH_REASON_LENGTH

    duplicate = shard_pb2.StepRequest(
        step_id=3,
        new_requests=[new_request(5), new_request(5)],
        scheduled=[shard_pb2.ScheduledRequest(id=5, num_tokens=len(PROMPT), new_block_ids=[2, 0])],
    )
    with pytest.raises(grpc.aio.AioRpcError) as invalid:
        await stub.Step(duplicate)
    assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "already registered" in (invalid.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as after_failure:
        await stub.Step(shard_pb2.StepRequest(step_id=4, new_requests=[new_request(6)]))
    assert after_failure.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "Reset first" in (after_failure.value.details() or "")

    await stub.Reset(shard_pb2.ResetRequest())
    await stub.Step(shard_pb2.StepRequest(step_id=0, new_requests=[new_request(7)]))
    await stub.Reset(shard_pb2.ResetRequest())
    stale = shard_pb2.StepRequest(scheduled=[shard_pb2.ScheduledRequest(id=7, num_tokens=7, new_block_ids=[2, 0])])
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await stub.Step(stale)
    assert unknown.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    await stub.Reset(shard_pb2.ResetRequest())
    await steps_sent_out_of_order_run_in_id_order(stub)


async def steps_sent_out_of_order_run_in_id_order(stub: shard_pb2_grpc.ShardServiceStub) -> None:
    # The decode runs the token the prefill samples: run first, it would name a request the shard does not know.
    prefill = shard_pb2.StepRequest(
        step_id=10,
        new_requests=[new_request(9)],
        scheduled=[shard_pb2.ScheduledRequest(id=9, num_tokens=len(PROMPT), new_block_ids=[2, 0])],
    )
    decode = shard_pb2.StepRequest(
        step_id=11, scheduled=[shard_pb2.ScheduledRequest(id=9, num_tokens=1, new_block_ids=[1], num_computed_tokens=7)]
    )
    # The first Step after a Reset may carry any id; the router sends it alone.
    await stub.Step(shard_pb2.StepRequest(step_id=9))
    decode_call = asyncio.ensure_future(stub.Step(decode))
    await asyncio.sleep(0.2)
    assert not decode_call.done(), "the decode waits for the step before it"
    first = await stub.Step(prefill)
    second = await decode_call
    assert [g.id for g in first.generations] == [9] and [g.id for g in second.generations] == [9]
    assert second.generations[0].finish_reason == shard_pb2.FINISH_REASON_LENGTH
    assert second.forward_gap_ms > 0.0
    await a_step_queued_behind_a_failing_step_is_refused(stub)


async def a_step_queued_behind_a_failing_step_is_refused(stub: shard_pb2_grpc.ShardServiceStub) -> None:
    unknown = shard_pb2.StepRequest(
        step_id=12, scheduled=[shard_pb2.ScheduledRequest(id=404, num_tokens=1, num_computed_tokens=7)]
    )
    valid_on_its_own = shard_pb2.StepRequest(
        step_id=13,
        new_requests=[new_request(20)],
        scheduled=[shard_pb2.ScheduledRequest(id=20, num_tokens=len(PROMPT), new_block_ids=[2, 0])],
    )
    failing, queued = await asyncio.gather(stub.Step(unknown), stub.Step(valid_on_its_own), return_exceptions=True)
    assert isinstance(failing, grpc.aio.AioRpcError) and "unknown to the shard" in (failing.details() or "")
    assert isinstance(queued, grpc.aio.AioRpcError) and queued.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "follows step 12" in (queued.details() or "")


def test_grpc_round_trip_over_unix_socket(tmp_path: Path) -> None:
    checkpoint = tmp_path / "model"
    write_tiny_llama(checkpoint)
    runner = make_runner(checkpoint)
    info = build_info(runner, "LlamaForCausalLM", "torch", ParallelContext())
    socket_path = tmp_path / "shard.sock"

    async def scenario() -> None:
        server = await start_server(ShardServicer(runner, info), socket_path)
        try:
            async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
                await exercise(shard_pb2_grpc.ShardServiceStub(channel))
        finally:
            await server.stop(None)

    asyncio.run(scenario())


def test_compilation_reports_the_largest_compiled_row_count_and_whether_more_compile() -> None:
    compiling = convert.compilation_to_pb(CompilationState((1, 2, 4), compiling=True))
    assert (compiling.decode_rows, compiling.compiling) == (4, True)
    nothing = convert.compilation_to_pb(CompilationState((), compiling=False))
    assert (nothing.decode_rows, nothing.compiling) == (0, False)


def test_warmup_requests_reach_the_runner_with_the_drafts_steps_may_carry() -> None:
    request = shard_pb2.WarmupRequest(
        block_size=16, max_batch_tokens=512, max_batch_requests=8, max_drafts=4, max_drafting_requests=3
    )
    assert convert.warmup_plan_from_pb(request) == WarmupPlan(16, 512, 8, max_drafts=4, max_drafting_requests=3)
    # A router that names no drafts (or predates them) leaves both zero: no step carries drafts.
    plain = convert.warmup_plan_from_pb(shard_pb2.WarmupRequest(block_size=16, max_batch_tokens=512))
    assert (plain.max_drafts, plain.max_drafting_requests) == (0, 0)


def test_health_stays_ok_while_warmup_runs_past_the_step_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Warmup compiles for minutes under --torch-compile; the launcher restarts shards whose Health fails.
    checkpoint = tmp_path / "model"
    write_tiny_llama(checkpoint)
    runner = make_runner(checkpoint)
    info = build_info(runner, "LlamaForCausalLM", "torch", ParallelContext())
    socket_path, stall_after_s = tmp_path / "shard.sock", 0.02
    warming, release = threading.Event(), threading.Event()
    warmup = runner.warmup

    def slow_warmup(plan: WarmupPlan) -> WarmupResult:
        warming.set()
        release.wait(timeout=10)
        return warmup(plan)

    monkeypatch.setattr(runner, "warmup", slow_warmup)

    async def scenario() -> None:
        model_thread = ModelThread(stall_after_s, runner.device)
        server = await start_server(ShardServicer(runner, info, model_thread=model_thread), socket_path)
        try:
            async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
                stub = shard_pb2_grpc.ShardServiceStub(channel)
                warm = asyncio.ensure_future(
                    stub.Warmup(shard_pb2.WarmupRequest(block_size=4, max_batch_tokens=32, max_batch_requests=4))
                )
                assert await asyncio.to_thread(warming.wait, 10)
                await asyncio.sleep(stall_after_s * 3)
                await stub.Health(shard_pb2.HealthRequest())
                release.set()
                await warm
                await stub.Health(shard_pb2.HealthRequest(deep=True))
        finally:
            release.set()
            await server.stop(None)

    asyncio.run(scenario())
