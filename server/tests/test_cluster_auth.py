"""A shard's TCP port serves only callers presenting the cluster secret; its Unix socket needs none."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import grpc
import pytest
from shard_testing import make_runner, write_tiny_llama
from tandem_server.config import ShardConfig
from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.rpc.cluster_auth import read_cluster_secret
from tandem_server.rpc.generated import shard_pb2, shard_pb2_grpc
from tandem_server.rpc.server import TcpListener, start_server, start_tcp_server
from tandem_server.rpc.servicer import ShardServicer, build_info

SECRET = "a-long-cluster-secret"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def info_code(target: str, metadata: tuple[tuple[str, str], ...] | None) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(target) as channel:
        try:
            await shard_pb2_grpc.ShardServiceStub(channel).Info(shard_pb2.InfoRequest(), metadata=metadata, timeout=10)
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK


def test_tcp_calls_need_the_cluster_secret_and_the_unix_socket_does_not(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path / "model")
    runner = make_runner(tmp_path / "model")
    servicer = ShardServicer(runner, build_info(runner, "LlamaForCausalLM", "torch", ParallelContext()))
    listener = TcpListener("127.0.0.1", free_port(), SECRET)

    async def scenario() -> list[grpc.StatusCode]:
        servers = [await start_server(servicer, tmp_path / "shard.sock"), await start_tcp_server(servicer, listener)]
        try:
            target = listener.target
            return [
                await info_code(target, None),
                await info_code(target, (("authorization", "Bearer wrong-secret"),)),
                await info_code(target, (("authorization", SECRET),)),
                await info_code(target, (("authorization", f"Bearer {SECRET}"),)),
                await info_code(f"unix:{tmp_path / 'shard.sock'}", None),
            ]
        finally:
            await asyncio.gather(*(server.stop(None) for server in servers))

    codes = asyncio.run(scenario())
    unauthenticated = grpc.StatusCode.UNAUTHENTICATED
    assert codes == [unauthenticated, unauthenticated, unauthenticated, grpc.StatusCode.OK, grpc.StatusCode.OK]


def test_the_secret_file_is_read_stripped_and_an_empty_or_missing_one_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text(f"  {SECRET}\n")
    assert read_cluster_secret(tmp_path / "secret") == SECRET
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        read_cluster_secret(tmp_path / "empty")
    with pytest.raises(ConfigError, match="cannot read --cluster-secret-file"):
        read_cluster_secret(tmp_path / "absent")


def test_a_tcp_port_without_a_secret_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--grpc-port needs --cluster-secret-file"):
        ShardConfig(model_path=tmp_path, uds_path=tmp_path / "s.sock", grpc_port=50051)
