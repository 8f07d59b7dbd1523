"""Random draws that depend only on (request seed, token position), never on the batch.

Each sampled row draws one uniform number on the host from its (seed, position) and picks its token by inverting its
distribution's cumulative sum at that number. The work queued on the device is the same whatever the number of rows
(no generator per row), and the uniform numbers are the same on every device and every tensor-parallel rank.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1
# A key's top 52 bits plus one half make a float64 uniform number exactly: the largest is 1 - 2**-53.
_UNIFORM_BITS = 52


def mix_seed(seed: int, position: int) -> int:
    """A 63-bit key from (seed, position) via splitmix64 finalisation."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def uniform_draw(seed: int, position: int) -> float:
    """A uniform number in (0, 1), never 0 or 1, from (seed, position)."""
    return ((mix_seed(seed, position) >> (63 - _UNIFORM_BITS)) + 0.5) / (1 << _UNIFORM_BITS)


def inverse_cdf_draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of `probs` ([rows, vocab]), token i with probability probs[i] / sum(probs): the first
    token whose cumulative mass exceeds the row's uniform share of its total. A token of probability 0 adds no mass,
    so it is never the first to exceed anything. The sum is float64, so no rounding moves a boundary by more than a
    token of probability 1e-12 could."""
    cumulative = probs.to(torch.float64).cumsum(dim=-1)
    total = cumulative[:, -1]
    # Strictly below the total, however the product rounds: some token's cumulative mass always exceeds it.
    targets = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total))).unsqueeze(1)
    chosen = torch.searchsorted(cumulative, targets, right=True).squeeze(1)
    # Only a row without any mass (no finite logit) reaches past the end; its status already marks it failed.
    return chosen.clamp_max(probs.shape[-1] - 1)
