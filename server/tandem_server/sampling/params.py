"""Per-request sampling parameters and their per-step tensor form."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 is greedy; top_k 0 and top_p 1.0 are disabled."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class SamplingBatch:
    """One row per request that samples this step; tensors exist only for the processors some row needs."""

    params: tuple[SamplingParams, ...]
    # Absolute position the sampled token will occupy in its request (seeds the draw).
    positions: tuple[int, ...]
    temperature: torch.Tensor | None
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None

    @classmethod
    def build(cls, params: Sequence[SamplingParams], positions: Sequence[int], device: torch.device) -> SamplingBatch:
        """Greedy rows keep temperature 1 so they pass warpers untouched; they are argmaxed anyway."""
        sampled = [p for p in params if not p.greedy]
        temperature = top_k = top_p = None
        if sampled:
            temperature = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=device)
        if any(p.top_k > 0 for p in sampled):
            top_k = torch.tensor([p.top_k if p.top_k > 0 and not p.greedy else 0 for p in params], device=device)
        if any(p.top_p < 1.0 for p in sampled):
            top_p = torch.tensor([1.0 if p.greedy else p.top_p for p in params], device=device)
        return cls(tuple(params), tuple(positions), temperature, top_k, top_p)

    @property
    def all_greedy(self) -> bool:
        return self.temperature is None
