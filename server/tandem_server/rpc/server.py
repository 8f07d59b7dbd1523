"""The grpc.aio servers: a Unix socket, and for a router on another node a TCP port guarded by the cluster secret;
bound only once the model is loaded, stopped on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from tandem_server.rpc.cluster_auth import ClusterSecretInterceptor
from tandem_server.rpc.generated import shard_pb2_grpc
from tandem_server.rpc.servicer import ShardServicer

logger = logging.getLogger(__name__)

_GRACE_SECONDS = 5.0
# Long prompts travel as token ids inside one StepRequest; gRPC's 4 MiB default is too small for them.
_MAX_MESSAGE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class TcpListener:
    """A TCP address serving the shard to a router on another node; every call must carry `secret`."""

    host: str
    port: int
    secret: str = field(repr=False)

    @property
    def target(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _new_server(interceptors: list[grpc.aio.ServerInterceptor]) -> grpc.aio.Server:
    return grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
        ],
    )


async def start_server(servicer: ShardServicer, uds_path: Path) -> grpc.aio.Server:
    """Binds `unix:uds_path` (replacing a stale socket file) and starts serving."""
    uds_path.parent.mkdir(parents=True, exist_ok=True)
    uds_path.unlink(missing_ok=True)
    server = _new_server([])
    shard_pb2_grpc.add_ShardServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{uds_path}")
    await server.start()
    return server


async def start_tcp_server(servicer: ShardServicer, listener: TcpListener) -> grpc.aio.Server:
    """Serves the same servicer on TCP; calls without the cluster secret are refused UNAUTHENTICATED."""
    server = _new_server([ClusterSecretInterceptor(listener.secret)])
    shard_pb2_grpc.add_ShardServiceServicer_to_server(servicer, server)
    server.add_insecure_port(listener.target)
    await server.start()
    return server


async def serve_until_signalled(servicer: ShardServicer, uds_path: Path, tcp: TcpListener | None = None) -> None:
    """Serves until SIGTERM or SIGINT, then lets in-flight calls finish within a grace period."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    servers = [await start_server(servicer, uds_path)]
    logger.info("ready: serving on unix:%s", uds_path)
    if tcp is not None:
        servers.append(await start_tcp_server(servicer, tcp))
        logger.info("serving on tcp %s for a router on another node (cluster secret required)", tcp.target)
    try:
        await stop.wait()
        logger.info("stopping")
        await asyncio.gather(*(server.stop(_GRACE_SECONDS) for server in servers))
    finally:
        servicer.shut_down()
        uds_path.unlink(missing_ok=True)
