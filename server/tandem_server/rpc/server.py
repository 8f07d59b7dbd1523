"""The grpc.aio server on a Unix socket: bound only once the model is loaded, stopped on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import grpc

from tandem_server.rpc.generated import shard_pb2_grpc
from tandem_server.rpc.servicer import ShardServicer

logger = logging.getLogger(__name__)

_GRACE_SECONDS = 5.0
# Long prompts travel as token ids inside one StepRequest; gRPC's 4 MiB default is too small for them.
_MAX_MESSAGE_BYTES = 256 * 1024 * 1024


async def start_server(servicer: ShardServicer, uds_path: Path) -> grpc.aio.Server:
    """Binds `unix:uds_path` (replacing a stale socket file) and starts serving."""
    uds_path.parent.mkdir(parents=True, exist_ok=True)
    uds_path.unlink(missing_ok=True)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
        ]
    )
    shard_pb2_grpc.add_ShardServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{uds_path}")
    await server.start()
    return server


async def serve_until_signalled(servicer: ShardServicer, uds_path: Path) -> None:
    """Serves until SIGTERM or SIGINT, then lets in-flight calls finish within a grace period."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    server = await start_server(servicer, uds_path)
    logger.info("ready: serving on unix:%s", uds_path)
    try:
        await stop.wait()
        logger.info("stopping")
        await server.stop(_GRACE_SECONDS)
    finally:
        servicer.shut_down()
        uds_path.unlink(missing_ok=True)
