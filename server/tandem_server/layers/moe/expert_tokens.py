"""A model's per-layer counts of the token-expert pairs each expert received, read and excluded as one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from tandem_server.layers.moe.block import SparseMoeBlock


def _layer_index(module_name: str) -> int:
    """The decoder layer a module belongs to: the last index in its name (`model.layers.3.mlp` -> 3)."""
    indices = [int(part) for part in module_name.split(".") if part.isdigit()]
    if not indices:
        raise ValueError(f"invariant: an MoE block sits inside a numbered decoder layer, not at {module_name!r}")
    return indices[-1]


class ExpertTokenCounters:
    """The `expert_tokens` buffers of every MoE block of a model, by decoder layer; empty for a dense model."""

    def __init__(self, model: nn.Module) -> None:
        blocks = [(name, module) for name, module in model.named_modules() if isinstance(module, SparseMoeBlock)]
        self._counters = [(_layer_index(name), block.expert_tokens) for name, block in blocks]

    def __bool__(self) -> bool:
        return bool(self._counters)

    def read(self) -> list[tuple[int, list[int]]]:
        """(decoder layer, tokens routed to each expert) per MoE layer, copied to the host in one transfer."""
        if not self._counters:
            return []
        counts = torch.stack([counter for _, counter in self._counters]).tolist()
        return [(layer, row) for (layer, _), row in zip(self._counters, counts, strict=True)]

    @contextlib.contextmanager
    def excluded(self) -> Iterator[None]:
        """Runs the block with the counts it started with restored afterwards: warm-up and health-probe forwards
        route made-up tokens that no client sent."""
        saved = [counter.clone() for _, counter in self._counters]
        try:
            yield
        finally:
            for (_, counter), before in zip(self._counters, saved, strict=True):
                counter.copy_(before)
