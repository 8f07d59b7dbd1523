"""Typed shard errors; `rpc/status.py` is the one place that turns them into gRPC status codes."""

from __future__ import annotations

from enum import Enum


class ShardError(Exception):
    """Base class of every error the shard raises on purpose."""


class ConfigError(ShardError):
    """The flags, the checkpoint or the model configuration cannot be served."""


class UnsupportedArchitectureError(ConfigError):
    """`config.architectures[0]` names a model family the shard does not implement."""

    def __init__(self, architecture: str, supported: list[str]) -> None:
        super().__init__(
            f"unsupported architecture {architecture!r}; supported architectures: {', '.join(sorted(supported))}"
        )
        self.architecture = architecture
        self.supported = supported


class WeightsError(ConfigError):
    """The checkpoint's tensors do not match the model (missing, unexpected or misshapen)."""


class LoraAdapterError(ShardError):
    """A LoRA adapter cannot serve on this base model (its files, configuration, targets, shapes or rank); the
    message names the adapter, the tensor or setting at fault, and what was expected."""


class LoraAdapterExistsError(ShardError):
    """A LoRA adapter of that name is already loaded."""


class LoraAdapterNotFoundError(ShardError):
    """No LoRA adapter of that name is loaded."""


class InvalidStepError(ShardError):
    """A Step contradicts itself or the model (duplicate ids, too few blocks, unknown ids)."""


class FailureKind(Enum):
    """Why the shard ended one request without a token; each belongs to that request alone."""

    TOKEN_OUT_OF_RANGE = "token_out_of_range"
    INVALID_PARAMETERS = "invalid_parameters"
    GRAMMAR = "grammar"
    NO_VALID_TOKEN = "no_valid_token"
    NON_FINITE_LOGITS = "non_finite_logits"
    ADAPTER_UNAVAILABLE = "adapter_unavailable"


class RequestFailedError(ShardError):
    """One request cannot go on: the engine ends that request alone and the Step continues.

    Never reaches `rpc/status.py`; the message is what the request's client reads, so it stays short.
    """

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class StateMismatchError(ShardError):
    """A Step disagrees with the shard's request state; the router should Reset."""


class StepRefusedError(ShardError):
    """A Step planned against state that is gone: an earlier Step failed, or the shard was reset since."""


class NotWarmedUpError(ShardError):
    """An RPC that needs the KV cache arrived before Warmup."""


class ModelThreadStalledError(ShardError):
    """A job on the model thread has outrun the step timeout: the device is presumed wedged."""


class CacheBudgetError(ShardError):
    """The KV cache budget cannot hold a single block."""


class ImageError(ShardError):
    """An image cannot be decoded or preprocessed; the request that carries it fails alone."""
