"""Attention over the paged KV cache behind one interface; the backend is chosen once at start-up."""

from __future__ import annotations

from tandem_server.errors import ConfigError
from tandem_server.layers.attention.backend import AttentionBackend, AttentionParams, LayerCache
from tandem_server.layers.attention.metadata import AttentionMetadata, DecodeGroup, PrefillSpan
from tandem_server.layers.attention.torch_backend import TorchAttentionBackend

BACKENDS: dict[str, type[AttentionBackend]] = {TorchAttentionBackend.name: TorchAttentionBackend}


def create_backend(name: str) -> AttentionBackend:
    """The attention backend registered under `name`."""
    if name not in BACKENDS:
        raise ConfigError(f"unknown attention backend {name!r}; available: {', '.join(sorted(BACKENDS))}")
    return BACKENDS[name]()


__all__ = [
    "BACKENDS",
    "AttentionBackend",
    "AttentionMetadata",
    "AttentionParams",
    "DecodeGroup",
    "LayerCache",
    "PrefillSpan",
    "TorchAttentionBackend",
    "create_backend",
]
