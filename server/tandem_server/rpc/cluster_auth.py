"""The cluster secret: TCP callers (a router on another node) present it as `authorization: Bearer <secret>`."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from tandem_server.errors import ConfigError

AUTHORIZATION = "authorization"


def read_cluster_secret(path: Path) -> str:
    """The secret in `path`, surrounding whitespace removed; an unreadable or empty file cannot start a shard."""
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise ConfigError(f"cannot read --cluster-secret-file {path}: {error.strerror}") from error
    if not secret:
        raise ConfigError(f"--cluster-secret-file {path} is empty")
    return secret


async def _refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong cluster secret")


class ClusterSecretInterceptor(grpc.aio.ServerInterceptor):
    """Lets a call through only when its `authorization` metadata is `Bearer <secret>` (compared in constant time)."""

    def __init__(self, secret: str) -> None:
        self._expected = f"Bearer {secret}".encode()
        self._refusal = grpc.unary_unary_rpc_method_handler(_refuse)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        presented = b""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == AUTHORIZATION:
                presented = value.encode() if isinstance(value, str) else value
        if hmac.compare_digest(presented, self._expected):
            return await continuation(handler_call_details)
        return self._refusal
