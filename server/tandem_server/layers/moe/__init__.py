"""Mixture-of-experts feed-forward layers."""

from tandem_server.layers.moe.block import MoeArgs, SparseMoeBlock
from tandem_server.layers.moe.routing import RouterConfig

__all__ = ["MoeArgs", "RouterConfig", "SparseMoeBlock"]
