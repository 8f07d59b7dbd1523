"""LoRA adapters through the servicer over a Unix socket: Info lists them with the limits, LoadLoraAdapter and
UnloadLoraAdapter change the set (ALREADY_EXISTS, INVALID_ARGUMENT and NOT_FOUND leaving it unchanged), and a Step's
new requests run under the adapter they name."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from lora_testing import AdapterSpec, greedy, merged, write_adapter
from shard_testing import make_runner, write_tiny_llama
from tandem_server.distributed import ParallelContext
from tandem_server.rpc.generated import shard_pb2, shard_pb2_grpc
from tandem_server.rpc.server import start_server
from tandem_server.rpc.servicer import ShardServicer, build_info

PROMPT = [5, 17, 33, 8, 61, 12, 40]
NEW_TOKENS = 3
SPEC = AdapterSpec(rank=16, alpha=16, targets=("k_proj", "v_proj", "up_proj"), use_rslora=True, seed=4)


def new_request(request_id: int, adapter: str) -> shard_pb2.NewRequest:
    return shard_pb2.NewRequest(
        id=request_id,
        token_ids=PROMPT,
        sampling=shard_pb2.SamplingParameters(temperature=0.0),
        stopping=shard_pb2.StoppingCriteria(max_new_tokens=NEW_TOKENS),
        lora_adapter=adapter,
    )


async def generate(stub: shard_pb2_grpc.ShardServiceStub, adapters: dict[int, str], first_step: int) -> dict:
    """Runs one prefill of every request, then decodes until each finished; tokens by id, failures by id."""
    blocks = iter(range(1, 1000))
    new = [new_request(request_id, adapter) for request_id, adapter in adapters.items()]
    scheduled = [
        # Three blocks of 4 hold the prompt and every generated token.
        shard_pb2.ScheduledRequest(
            id=request_id, num_tokens=len(PROMPT), new_block_ids=[next(blocks) for _ in range(3)]
        )
        for request_id in adapters
    ]
    tokens: dict[int, list[int]] = {request_id: [] for request_id in adapters}
    failures = {}
    step_id = first_step
    response = await stub.Step(shard_pb2.StepRequest(step_id=step_id, new_requests=new, scheduled=scheduled))
    while True:
        failures.update({failure.id: failure for failure in response.failures})
        for generation in response.generations:
            tokens[generation.id].append(generation.token_id)
        running = [
            request_id for request_id in adapters if request_id not in failures and len(tokens[request_id]) < NEW_TOKENS
        ]
        if not running:
            return {"tokens": tokens, "failures": failures, "next_step": step_id + 1}
        step_id += 1
        decodes = [
            shard_pb2.ScheduledRequest(
                id=request_id, num_tokens=1, num_computed_tokens=len(PROMPT) + len(tokens[request_id]) - 1
            )
            for request_id in running
        ]
        response = await stub.Step(shard_pb2.StepRequest(step_id=step_id, scheduled=decodes))


async def rpc_error(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call  # type: ignore[misc]
    return raised.value


def test_adapters_load_serve_and_unload_through_the_servicer(tmp_path: Path) -> None:
    reference = write_tiny_llama(tmp_path / "model")
    good = write_adapter(tmp_path / "good", reference, SPEC)
    wide = write_adapter(tmp_path / "wide", reference, AdapterSpec(rank=128, alpha=8, targets=("q_proj",)))
    runner = make_runner(tmp_path / "model")
    info = build_info(runner, "LlamaForCausalLM", "torch", ParallelContext())
    socket_path = tmp_path / "shard.sock"
    expected = greedy(merged(reference, good, SPEC), PROMPT, NEW_TOKENS)[0]
    base = greedy(reference, PROMPT, NEW_TOKENS)[0]

    async def scenario(stub: shard_pb2_grpc.ShardServiceStub) -> None:
        info = await stub.Info(shard_pb2.InfoRequest())
        assert (list(info.lora_adapters), info.max_loras, info.max_lora_rank) == ([], 4, 64)
        loaded = await stub.LoadLoraAdapter(shard_pb2.LoadLoraAdapterRequest(name="good", path=str(good)))
        assert (loaded.adapter.name, loaded.adapter.rank) == ("good", 16)
        assert list(loaded.adapter.target_modules) == ["k_proj", "up_proj", "v_proj"]

        taken = await rpc_error(stub.LoadLoraAdapter(shard_pb2.LoadLoraAdapterRequest(name="good", path=str(wide))))
        assert taken.code() == grpc.StatusCode.ALREADY_EXISTS and "'good' is already loaded" in (taken.details() or "")
        refused = await rpc_error(stub.LoadLoraAdapter(shard_pb2.LoadLoraAdapterRequest(name="wide", path=str(wide))))
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "LoRA adapter 'wide': rank 128 is above the shard's --max-lora-rank 64" in (refused.details() or "")
        info = await stub.Info(shard_pb2.InfoRequest())
        assert [(adapter.name, adapter.rank) for adapter in info.lora_adapters] == [("good", 16)]

        await stub.Warmup(shard_pb2.WarmupRequest(block_size=4, max_batch_tokens=64, max_batch_requests=4))
        served = await generate(stub, {1: "good", 2: "", 3: "absent"}, first_step=1)
        assert served["tokens"][1] == expected and served["tokens"][2] == base
        assert expected != base
        failure = served["failures"][3]
        assert failure.kind == shard_pb2.FAILURE_KIND_INVALID_PARAMETERS
        assert failure.message == "unknown LoRA adapter 'absent'"

        await stub.UnloadLoraAdapter(shard_pb2.UnloadLoraAdapterRequest(name="good"))
        assert list((await stub.Info(shard_pb2.InfoRequest())).lora_adapters) == []
        missing = await rpc_error(stub.UnloadLoraAdapter(shard_pb2.UnloadLoraAdapterRequest(name="good")))
        assert missing.code() == grpc.StatusCode.NOT_FOUND
        after = await generate(stub, {4: "good"}, first_step=served["next_step"])
        assert after["failures"][4].message == "unknown LoRA adapter 'good'"

    async def main() -> None:
        server = await start_server(ShardServicer(runner, info), socket_path)
        try:
            async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
                await scenario(shard_pb2_grpc.ShardServiceStub(channel))
        finally:
            await server.stop(None)

    asyncio.run(main())
