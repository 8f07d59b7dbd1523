"""A rank on cuda:1 keeps all its CUDA work on device 1: Warmup (memory probes, graph capture) and a Step (timer
events) through the real servicer and model thread, under a fake CUDA runtime whose current device is per thread."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import torch
from fake_cuda import FakeCuda
from shard_testing import load_tiny_model, write_tiny_llama
from tandem_server.distributed import ParallelContext
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.layers.attention import SdpaAttentionBackend
from tandem_server.lora import LoraLimits
from tandem_server.rpc.generated import shard_pb2
from tandem_server.rpc.servicer import ShardServicer, build_info

RANK_DEVICE = torch.device("cuda", 1)
PROMPT = [5, 17, 33, 8, 61, 12, 40]


class AbortingContext:
    """What translate_errors needs of a gRPC context: abort raises with the status it was given."""

    async def abort(self, code: object, details: str) -> None:
        raise AssertionError(f"RPC aborted with {code}: {details}")


def _prefill_step() -> shard_pb2.StepRequest:
    request = shard_pb2.NewRequest(
        id=1,
        token_ids=PROMPT,
        sampling=shard_pb2.SamplingParameters(temperature=0.7, seed=3),
        stopping=shard_pb2.StoppingCriteria(max_new_tokens=4),
    )
    scheduled = shard_pb2.ScheduledRequest(id=1, num_tokens=len(PROMPT), new_block_ids=[2, 0])
    return shard_pb2.StepRequest(step_id=1, new_requests=[request], scheduled=[scheduled])


def test_rank_one_runs_warmup_and_steps_on_device_one_from_its_model_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tiny_llama(tmp_path)
    # The model's weights live on the CPU (the fake places every CUDA tensor there); the runner believes cuda:1.
    model = load_tiny_model(tmp_path, backend=SdpaAttentionBackend())
    # No LoRA slots: the fake device's 2 MiB would not hold them beside the cache.
    options = ExecutionOptions(cuda_memory_fraction=0.5, cuda_graph_sizes=(1, 2), lora=LoraLimits(max_loras=0))
    fake = FakeCuda(free_bytes=2 * 1024 * 1024)
    fake.graph_pool_bytes = 256 * 1024
    fake.install(monkeypatch)
    # The main thread took its device at start-up, as init_distributed does for rank 1.
    torch.cuda.set_device(RANK_DEVICE)
    runner = ModelRunner(model, (2,), torch.float32, RANK_DEVICE, options=options)
    servicer = ShardServicer(runner, build_info(runner, "LlamaForCausalLM", "sdpa", ParallelContext(1, 2)))
    fake.calls.clear()

    async def scenario() -> tuple[shard_pb2.WarmupResponse, shard_pb2.StepResponse]:
        context = AbortingContext()
        warmup = shard_pb2.WarmupRequest(block_size=4, max_batch_tokens=16, max_batch_requests=2)
        warmed = await servicer.Warmup(warmup, context)
        stepped = await servicer.Step(_prefill_step(), context)
        return warmed, stepped

    try:
        warmed, stepped = asyncio.run(scenario())
    finally:
        servicer.shut_down()
    assert [g.id for g in stepped.generations] == [1]
    # Half the free memory, less the profiled step (4096 bytes) and the probe-captured graph's pool, in 2 KiB blocks
    # (one kept back); the probe's own two-block cache lives in the pool's measurement, not the budget.
    probe_cache_bytes = 2 * runner.cache.geometry.bytes_per_block
    budget = 1024 * 1024 - 4096 - (256 * 1024 - probe_cache_bytes)
    assert warmed.num_blocks == budget // runner.cache.geometry.bytes_per_block - 1
    names = {call.name for call in fake.calls}
    # Memory probes, graph capture on the rank's own stream, and the step timer's events all took place.
    assert {"mem_get_info", "Stream", "graph", "Event.record", "tensor placement"} <= names, names
    wrong_device = sorted({(call.name, call.device) for call in fake.calls if call.device != 1})
    assert wrong_device == [], f"CUDA calls that landed off the rank's device: {wrong_device}"
    threads = {call.thread for call in fake.calls}
    assert threading.get_ident() not in threads and len(threads) == 1, "all CUDA work runs on the one model thread"
