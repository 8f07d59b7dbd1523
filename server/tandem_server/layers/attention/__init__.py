"""Attention over the paged KV cache behind one interface; the backend is chosen once at start-up."""

from __future__ import annotations

from tandem_server.interfaces.attention import BackendSettings
from tandem_server.interfaces.attention_registry import ATTENTION_REGISTRY
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


def create_backend(name: str, decode_mirror_memory: int | None = 0) -> AttentionBackend:
    """A new instance of the registered backend `name`; flash and triton import their optional packages here.

    `decode_mirror_memory` is the `torch` backend's budget for its decode mirror (None: half of the KV cache it binds);
    the other backends need none.
    """
    backend: AttentionBackend = ATTENTION_REGISTRY.create(name, BackendSettings(decode_mirror_memory))
    return backend


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
