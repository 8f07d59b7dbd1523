"""Typed shard errors; `rpc/status.py` is the one place that turns them into gRPC status codes."""

from __future__ import annotations


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


class InvalidStepError(ShardError):
    """A Step contradicts itself or the model (duplicate ids, too few blocks, unknown ids)."""


class StateMismatchError(ShardError):
    """A Step disagrees with the shard's request state; the router should Reset."""


class NotWarmedUpError(ShardError):
    """An RPC that needs the KV cache arrived before Warmup."""


class ModelThreadStalledError(ShardError):
    """A job on the model thread has outrun the step timeout: the device is presumed wedged."""


class CacheBudgetError(ShardError):
    """The KV cache budget cannot hold a single block."""
