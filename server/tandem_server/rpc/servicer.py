"""ShardService over grpc.aio: one Step at a time, model work on a worker thread so Health stays live."""

from __future__ import annotations

import asyncio
import time

import grpc

from tandem_server.config import dtype_name
from tandem_server.distributed import ParallelContext
from tandem_server.engine.model_runner import ModelRunner
from tandem_server.metrics import ShardMetrics
from tandem_server.rpc import convert
from tandem_server.rpc.generated import shard_pb2, shard_pb2_grpc
from tandem_server.rpc.status import translate_errors


class ShardServicer(shard_pb2_grpc.ShardServiceServicer):
    """Translates RPCs into ModelRunner calls; the lock serialises everything that touches tensors."""

    def __init__(self, runner: ModelRunner, info: shard_pb2.InfoResponse, metrics: ShardMetrics | None = None) -> None:
        self._runner = runner
        self._info = info
        self._metrics = metrics
        self._lock = asyncio.Lock()

    @translate_errors
    async def Info(self, request: shard_pb2.InfoRequest, context: grpc.aio.ServicerContext) -> shard_pb2.InfoResponse:
        return self._info

    @translate_errors
    async def Health(
        self, request: shard_pb2.HealthRequest, context: grpc.aio.ServicerContext
    ) -> shard_pb2.HealthResponse:
        if request.deep:
            async with self._lock:
                await asyncio.to_thread(self._runner.health_check)
        return shard_pb2.HealthResponse()

    @translate_errors
    async def Warmup(
        self, request: shard_pb2.WarmupRequest, context: grpc.aio.ServicerContext
    ) -> shard_pb2.WarmupResponse:
        async with self._lock:
            result = await asyncio.to_thread(
                self._runner.warmup, request.block_size, request.max_batch_tokens, request.max_batch_requests
            )
        if self._metrics is not None:
            self._metrics.kv_cache_allocated(result.kv_cache_bytes)
        return convert.warmup_result_to_pb(result)

    @translate_errors
    async def Step(self, request: shard_pb2.StepRequest, context: grpc.aio.ServicerContext) -> shard_pb2.StepResponse:
        start = time.perf_counter()
        step = convert.step_input_from_pb(request)
        async with self._lock:
            output = await asyncio.to_thread(self._runner.step, step)
        if self._metrics is not None:
            self._metrics.step_done(step, output.forward_ms, output.sampling_ms)
        response = convert.step_output_to_pb(output)
        response.shard_total_ms = (time.perf_counter() - start) * 1000.0
        return response

    @translate_errors
    async def Reset(
        self, request: shard_pb2.ResetRequest, context: grpc.aio.ServicerContext
    ) -> shard_pb2.ResetResponse:
        async with self._lock:
            self._runner.reset()
        return shard_pb2.ResetResponse()


def build_info(
    runner: ModelRunner, architecture: str, attention_backend: str, parallel: ParallelContext
) -> shard_pb2.InfoResponse:
    """Model facts reported by Info, fixed for the life of the process."""
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
    )
