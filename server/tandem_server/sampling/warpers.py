"""Warpers that shape the distribution a non-greedy row draws from; each has per-row parameters."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tandem_server.device_copy import to_device
from tandem_server.sampling.params import SamplingParams

_NEG_INF = float("-inf")


class Temperature:
    """logits / temperature."""

    def __init__(self, params: Sequence[SamplingParams], device: torch.device) -> None:
        self.temperature = _column([p.temperature for p in params], device)

    @staticmethod
    def needed(params: Sequence[SamplingParams]) -> bool:
        return any(p.temperature != 1.0 for p in params)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return logits / self.temperature


class TopKTopP:
    """Top-k (0 keeps all) then top-p (smallest head reaching mass top_p), on one shared sort."""

    def __init__(self, params: Sequence[SamplingParams], device: torch.device) -> None:
        self.top_k = to_device(torch.tensor([p.top_k for p in params]), device) if _any_top_k(params) else None
        self.top_p = _column([p.top_p for p in params], device) if _any_top_p(params) else None

    @staticmethod
    def needed(params: Sequence[SamplingParams]) -> bool:
        return _any_top_k(params) or _any_top_p(params)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
        vocab = logits.shape[-1]
        ranks = torch.arange(vocab, device=logits.device).expand_as(sorted_logits)
        if self.top_k is not None:
            keep = torch.where(self.top_k > 0, self.top_k, vocab).clamp(max=vocab).unsqueeze(1)
            sorted_logits = sorted_logits.masked_fill(ranks >= keep, _NEG_INF)
        if self.top_p is not None:
            probs = sorted_logits.softmax(dim=-1)
            mass_before = probs.cumsum(dim=-1) - probs
            # The most likely token always survives, so no row is left empty.
            drop = (mass_before >= self.top_p) & (ranks > 0)
            sorted_logits = sorted_logits.masked_fill(drop, _NEG_INF)
        return torch.full_like(logits, _NEG_INF).scatter(-1, order, sorted_logits)


class TypicalP:
    """Locally typical sampling: keep the tokens closest to the entropy until their mass reaches typical_p."""

    def __init__(self, params: Sequence[SamplingParams], device: torch.device) -> None:
        self.mass = _column([p.typical_p for p in params], device)

    @staticmethod
    def needed(params: Sequence[SamplingParams]) -> bool:
        return any(p.typical_p < 1.0 for p in params)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        logprobs = logits.log_softmax(dim=-1)
        probs = logprobs.exp()
        entropy = -(probs * logprobs.nan_to_num(neginf=0.0)).sum(dim=-1, keepdim=True)
        surprise_gap = (-logprobs - entropy).abs()
        _, order = surprise_gap.sort(dim=-1, stable=True)
        sorted_probs = probs.gather(-1, order)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        # The most typical token always survives; rows with mass 1.0 keep everything.
        drop_sorted = (mass_before >= self.mass) & (torch.arange(logits.shape[-1], device=logits.device) > 0)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        return logits.masked_fill(drop, _NEG_INF)


class MinP:
    """Drops tokens whose probability is below min_p times the most likely token's."""

    def __init__(self, params: Sequence[SamplingParams], device: torch.device) -> None:
        self.min_p = _column([p.min_p for p in params], device)

    @staticmethod
    def needed(params: Sequence[SamplingParams]) -> bool:
        return any(p.min_p > 0.0 for p in params)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        probs = logits.softmax(dim=-1)
        threshold = self.min_p * probs.max(dim=-1, keepdim=True).values
        return logits.masked_fill(probs < threshold, _NEG_INF)


def _column(values: Sequence[float], device: torch.device) -> torch.Tensor:
    """[rows, 1] float32 on `device`, copied without waiting for the device."""
    return to_device(torch.tensor(values, dtype=torch.float32), device).unsqueeze(1)


def _any_top_k(params: Sequence[SamplingParams]) -> bool:
    return any(p.top_k > 0 for p in params)


def _any_top_p(params: Sequence[SamplingParams]) -> bool:
    return any(p.top_p < 1.0 for p in params)


# Applied in this order to the sampled rows after temperature.
WARPERS = (Temperature, TopKTopP, TypicalP, MinP)
