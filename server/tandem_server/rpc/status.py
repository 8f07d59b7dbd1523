"""The one place where shard exceptions become gRPC status codes."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from tandem_server.errors import (
    CacheBudgetError,
    ConfigError,
    InvalidStepError,
    ModelThreadStalledError,
    NotWarmedUpError,
    StateMismatchError,
    StepRefusedError,
)

logger = logging.getLogger(__name__)

Request = TypeVar("Request")
Response = TypeVar("Response")
Handler = Callable[[object, Request, grpc.aio.ServicerContext], Awaitable[Response]]

_STATUS_CODES: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (InvalidStepError, grpc.StatusCode.INVALID_ARGUMENT),
    (StateMismatchError, grpc.StatusCode.FAILED_PRECONDITION),
    (NotWarmedUpError, grpc.StatusCode.FAILED_PRECONDITION),
    (StepRefusedError, grpc.StatusCode.FAILED_PRECONDITION),
    (CacheBudgetError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ModelThreadStalledError, grpc.StatusCode.UNAVAILABLE),
    (ConfigError, grpc.StatusCode.FAILED_PRECONDITION),
)


def status_code_for(error: Exception) -> grpc.StatusCode:
    """INVALID_ARGUMENT for self-contradictory steps, FAILED_PRECONDITION for state problems, else INTERNAL."""
    for error_type, code in _STATUS_CODES:
        if isinstance(error, error_type):
            return code
    return grpc.StatusCode.INTERNAL


def translate_errors(handler: Handler) -> Handler:
    """Wraps an RPC handler so every exception ends the call with its mapped status and message."""

    @functools.wraps(handler)
    async def wrapper(self: object, request: Request, context: grpc.aio.ServicerContext) -> Response:
        try:
            return await handler(self, request, context)
        except Exception as error:
            code = status_code_for(error)
            if code == grpc.StatusCode.INTERNAL:
                logger.exception("%s failed", handler.__name__)
            await context.abort(code, str(error) or type(error).__name__)

    return wrapper
