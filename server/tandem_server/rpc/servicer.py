"""ShardService over grpc.aio: one Step at a time, model work on a worker thread so Health stays live."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import grpc
import torch

from tandem_server.config import dtype_name
from tandem_server.distributed import ParallelContext
from tandem_server.engine.launched import LaunchedStep
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.engine.step import StepInput, StepOutput, WarmupPlan, WarmupResult
from tandem_server.lora import LoraRegistry
from tandem_server.metrics import CompilationState, ShardMetrics
from tandem_server.quant.quantize import QuantizationReport
from tandem_server.rpc import convert
from tandem_server.rpc.generated import shard_pb2, shard_pb2_grpc
from tandem_server.rpc.model_thread import ModelThread
from tandem_server.rpc.status import status_code_for, translate_errors
from tandem_server.rpc.step_order import StepOrder
from tandem_server.telemetry import StepTracer

logger = logging.getLogger(__name__)

# Exit status of a tensor-parallel rank that left its group after a failed step.
EXIT_GROUP_OUT_OF_STEP = 3
_ANSWER_BEFORE_EXIT_S = 0.5


class ShardRunner(Protocol):
    """What the servicer drives: the ModelRunner, or a wrapper around it."""

    @property
    def device(self) -> torch.device: ...

    @property
    def options(self) -> ExecutionOptions: ...

    def warmup(self, plan: WarmupPlan) -> WarmupResult: ...

    def health_check(self) -> None: ...

    def launch(self, step: StepInput) -> LaunchedStep: ...

    def complete(self, launched: LaunchedStep) -> StepOutput: ...

    def reset(self) -> None: ...

    def compilation(self) -> CompilationState: ...

    @property
    def lora(self) -> LoraRegistry: ...


class ShardServicer(shard_pb2_grpc.ShardServiceServicer):
    """Translates RPCs into ModelRunner calls; the lock serialises everything that touches tensors."""

    def __init__(
        self,
        runner: ShardRunner,
        info: shard_pb2.InfoResponse,
        metrics: ShardMetrics | None = None,
        model_thread: ModelThread | None = None,
        tracer: StepTracer | None = None,
    ) -> None:
        self._runner = runner
        self._info = info
        self._metrics = metrics
        # Traces Steps whose call carries a sampled `traceparent`; None: tracing is off.
        self._tracer = tracer
        # Serialises everything that touches tensors; the model thread runs what holds it.
        self._lock = asyncio.Lock()
        # The thread that loaded the model (`cli.load_on_model_thread`); tests that built the runner themselves get
        # a fresh one without a stall limit, overlapping steps as the runner launches them.
        self._model = model_thread or ModelThread(None, runner.device, overlap_steps=runner.options.launch_ahead)
        self._order = StepOrder()

    @translate_errors
    async def Info(self, request: shard_pb2.InfoRequest, context: grpc.aio.ServicerContext) -> shard_pb2.InfoResponse:
        info = shard_pb2.InfoResponse()
        info.CopyFrom(self._info)
        # Read on the event loop while the model thread may load or unload: the listing is replaced whole.
        info.lora_adapters.extend(convert.lora_adapter_to_pb(adapter) for adapter in self._runner.lora.adapters)
        return info

    @translate_errors
    async def LoadLoraAdapter(
        self, request: shard_pb2.LoadLoraAdapterRequest, context: grpc.aio.ServicerContext
    ) -> shard_pb2.LoadLoraAdapterResponse:
        load = lambda: self._runner.lora.load(request.name, Path(request.path))  # noqa: E731
        async with self._lock:
            adapter = await self._model.run(load, stall_limited=False)
        return shard_pb2.LoadLoraAdapterResponse(adapter=convert.lora_adapter_to_pb(adapter))

    @translate_errors
    async def UnloadLoraAdapter(
        self, request: shard_pb2.UnloadLoraAdapterRequest, context: grpc.aio.ServicerContext
    ) -> shard_pb2.UnloadLoraAdapterResponse:
        async with self._lock:
            await self._model.run(lambda: self._runner.lora.unload(request.name))
        return shard_pb2.UnloadLoraAdapterResponse()

    @translate_errors
    async def Health(
        self, request: shard_pb2.HealthRequest, context: grpc.aio.ServicerContext
    ) -> shard_pb2.HealthResponse:
        self._model.check_not_stalled()
        if request.deep:
            async with self._lock:
                await self._model.run(self._runner.health_check)
        return shard_pb2.HealthResponse()

    @translate_errors
    async def Warmup(
        self, request: shard_pb2.WarmupRequest, context: grpc.aio.ServicerContext
    ) -> shard_pb2.WarmupResponse:
        async with self._lock:
            warmup = lambda: self._runner.warmup(convert.warmup_plan_from_pb(request))  # noqa: E731
            result = await self._model.run(warmup, stall_limited=False)
            await self._order.restart()
        if self._metrics is not None:
            self._metrics.kv_cache_allocated(result.kv_cache_bytes)
        return convert.warmup_result_to_pb(result)

    @translate_errors
    async def Step(self, request: shard_pb2.StepRequest, context: grpc.aio.ServicerContext) -> shard_pb2.StepResponse:
        if self._tracer is None:
            return await self._step(request)
        with self._tracer.step(context.invocation_metadata(), request) as span:
            response = await self._step(request)
            span.record(response)
            return response

    async def _step(self, request: shard_pb2.StepRequest) -> shard_pb2.StepResponse:
        decoding = time.perf_counter()
        step = convert.step_input_from_pb(request)
        decode_s = time.perf_counter() - decoding
        generation = await self._order.wait_for_turn(request.step_id)
        # Submitted in turn, so the model thread runs it right after the Step before it, with no hop through the
        # event loop in between; the lock keeps Warmup, Reset and deep probes in that same order.
        try:
            async with self._lock:
                self._order.check_current(request.step_id, generation)
                submitted = self._model.submit_staged(lambda: self._launch_step(request.step_id, step))
            output, job_s = await self._model.result(submitted)
        except Exception as error:
            await self._order.failed(request.step_id, generation)
            self._leave_group_if_out_of_step(error)
            raise
        if self._metrics is not None:
            self._metrics.step_done(step.phase, output.forward_ms, output.sampling_ms)
        encoding = time.perf_counter()
        response = convert.step_output_to_pb(output)
        response.compilation.CopyFrom(convert.compilation_to_pb(self._runner.compilation()))
        # Time queued behind earlier Steps is not this Step's handling.
        response.shard_total_ms = (decode_s + job_s + time.perf_counter() - encoding) * 1000.0
        return response

    def _launch_step(self, step_id: int, step: StepInput) -> Callable[[], tuple[StepOutput, float]]:
        """On the model thread: launches the Step, unless one before it failed since it was submitted; returns
        what completes it with its output and the model thread's time on it."""
        started = time.perf_counter()
        self._order.check_not_failed(step_id)
        try:
            launched = self._runner.launch(step)
        except Exception:
            self._order.mark_failed(step_id)
            raise
        launch_s = time.perf_counter() - started

        def complete() -> tuple[StepOutput, float]:
            completing = time.perf_counter()
            try:
                output = self._runner.complete(launched)
            except Exception:
                self._order.mark_failed(step_id)
                raise
            return output, launch_s + time.perf_counter() - completing

        return complete

    def _leave_group_if_out_of_step(self, error: Exception) -> None:
        """A rank whose step failed unexpectedly has left its tensor-parallel peers inside a collective, so the
        group cannot run on: once the error has been answered the process exits and the launcher restarts the
        group. A single rank keeps serving; the router resets it."""
        if self._info.world_size > 1 and status_code_for(error) == grpc.StatusCode.INTERNAL:
            logger.critical("rank %d failed mid-step; exiting so the shard group restarts", self._info.rank)
            asyncio.get_running_loop().call_later(_ANSWER_BEFORE_EXIT_S, os._exit, EXIT_GROUP_OUT_OF_STEP)

    @translate_errors
    async def Reset(
        self, request: shard_pb2.ResetRequest, context: grpc.aio.ServicerContext
    ) -> shard_pb2.ResetResponse:
        async with self._lock:
            await self._model.run(self._runner.reset)
            await self._order.restart()
        return shard_pb2.ResetResponse()

    def shut_down(self) -> None:
        """Stops the model thread taking jobs; a job still running is left to finish on its own. Exports the spans
        still queued."""
        self._model.shut_down()
        if self._tracer is not None:
            self._tracer.shut_down()


def build_info(
    runner: ModelRunner,
    architecture: str,
    attention_backend: str,
    parallel: ParallelContext,
    weights: QuantizationReport | None = None,
) -> shard_pb2.InfoResponse:
    """Model facts reported by Info, fixed for the life of the process (Info adds the LoRA adapters held now)."""
    spec = runner.model.spec
    return shard_pb2.InfoResponse(
        architecture=architecture,
        dtype=dtype_name(runner.dtype),
        device=runner.device.type,
        vocab_size=spec.vocab_size,
        eos_token_ids=list(runner.eos_token_ids),
        max_position_embeddings=spec.max_position_embeddings,
        num_layers=spec.num_layers,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        rank=parallel.rank,
        world_size=parallel.world_size,
        attention_backend=attention_backend,
        weights_format=weights.format_by_role() if weights is not None else "",
        weight_bytes=weights.weight_bytes if weights is not None else 0,
        draft_model=runner.draft_model.describe() if runner.draft_model is not None else "",
        recurrent_state=bool(spec.state_shapes),
        max_loras=runner.options.lora.max_loras,
        max_lora_rank=runner.options.lora.max_rank,
        vision_encoder=runner.images.description if runner.images is not None else "",
    )
