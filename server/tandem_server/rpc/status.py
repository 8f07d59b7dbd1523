"""The one place where shard exceptions become gRPC status codes."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import grpc

from tandem_server.errors import (
    CacheBudgetError,
    ConfigError,
    InvalidStepError,
    LoraAdapterError,
    LoraAdapterExistsError,
    LoraAdapterNotFoundError,
    ModelThreadStalledError,
    NotWarmedUpError,
    StateMismatchError,
    StepRefusedError,
)

logger = logging.getLogger(__name__)

Servicer = TypeVar("Servicer")
Request = TypeVar("Request")
Response = TypeVar("Response")

_STATUS_CODES: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (InvalidStepError, grpc.StatusCode.INVALID_ARGUMENT),
    (LoraAdapterError, grpc.StatusCode.INVALID_ARGUMENT),
    (LoraAdapterExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (LoraAdapterNotFoundError, grpc.StatusCode.NOT_FOUND),
    (StateMismatchError, grpc.StatusCode.FAILED_PRECONDITION),
    (NotWarmedUpError, grpc.StatusCode.FAILED_PRECONDITION),
    (StepRefusedError, grpc.StatusCode.FAILED_PRECONDITION),
    (CacheBudgetError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ModelThreadStalledError, grpc.StatusCode.UNAVAILABLE),
    (ConfigError, grpc.StatusCode.FAILED_PRECONDITION),
)


def status_code_for(error: Exception) -> grpc.StatusCode:
    """INVALID_ARGUMENT for self-contradictory steps and unusable adapters, ALREADY_EXISTS/NOT_FOUND for adapter
    names, FAILED_PRECONDITION for state problems, else INTERNAL."""
    for error_type, code in _STATUS_CODES:
        if isinstance(error, error_type):
            return code
    return grpc.StatusCode.INTERNAL


def translate_errors(
    handler: Callable[[Servicer, Request, grpc.aio.ServicerContext], Awaitable[Response]],
) -> Callable[[Servicer, Request, grpc.aio.ServicerContext], Coroutine[Any, Any, Response]]:
    """Wraps an RPC handler so every exception ends the call with its mapped status and message."""

    @functools.wraps(handler)
    async def wrapper(self: Servicer, request: Request, context: grpc.aio.ServicerContext) -> Response:
        try:
            return await handler(self, request, context)
        except Exception as error:
            code = status_code_for(error)
            if code == grpc.StatusCode.INTERNAL:
                logger.exception("%s failed", handler.__name__)
            await context.abort(code, str(error) or type(error).__name__)
            raise  # invariant: abort raises, ending the call; this line is never reached

    return wrapper
