"""Attention over the paged KV cache behind one interface; the backend is chosen once at start-up."""

from __future__ import annotations

from tandem_server.errors import ConfigError
from tandem_server.layers.attention.backend import (
    AttentionBackend,
    AttentionParams,
    KeepsStepState,
    LayerCache,
    PreparedStep,
)
from tandem_server.layers.attention.metadata import AttentionMetadata, HostLayout, PagedLayout, start_offsets
from tandem_server.layers.attention.sdpa_backend import SdpaAttentionBackend
from tandem_server.layers.attention.selection import BACKEND_CHOICES, BACKEND_NAMES
from tandem_server.layers.attention.static_metadata import StaticStepMetadata, UniformShape, is_decode_only
from tandem_server.layers.attention.torch_backend import TorchAttentionBackend


def create_backend(name: str, decode_mirror_memory: int = 0) -> AttentionBackend:
    """A new instance of the backend `name`; flash and triton import their optional packages here.

    `decode_mirror_memory` is the `torch` backend's budget for its decode mirror; the other backends need none.
    """
    if name == "torch":
        return TorchAttentionBackend(decode_mirror_memory)
    if name == "sdpa":
        return SdpaAttentionBackend()
    if name == "triton":
        from tandem_server.layers.attention.triton_backend import TritonAttentionBackend  # noqa: PLC0415

        return TritonAttentionBackend()
    if name == "flash":
        from tandem_server.layers.attention.flash_backend import FlashAttentionBackend  # noqa: PLC0415

        return FlashAttentionBackend()
    raise ConfigError(f"unknown attention backend {name!r}; available: {', '.join(BACKEND_NAMES)}")


__all__ = [
    "BACKEND_CHOICES",
    "BACKEND_NAMES",
    "AttentionBackend",
    "AttentionMetadata",
    "AttentionParams",
    "HostLayout",
    "KeepsStepState",
    "LayerCache",
    "PagedLayout",
    "PreparedStep",
    "SdpaAttentionBackend",
    "StaticStepMetadata",
    "TorchAttentionBackend",
    "UniformShape",
    "create_backend",
    "is_decode_only",
    "start_offsets",
]
