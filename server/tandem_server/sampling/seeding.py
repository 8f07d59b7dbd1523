"""Random draws that depend only on (request seed, token position), never on the batch."""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def mix_seed(seed: int, position: int) -> int:
    """A 63-bit generator seed from (seed, position) via splitmix64 finalisation."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def exponential_noise(seed: int, position: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    """Exp(1) noise over the vocabulary; argmax(probs / noise) is a draw from probs."""
    generator = torch.Generator(device=device)
    generator.manual_seed(mix_seed(seed, position))
    uniform = torch.rand(vocab_size, generator=generator, device=device, dtype=torch.float32)
    # A uniform draw of exactly 0 gives zero noise; clamped, a masked token (probability 0) scores 0, never 0/0 = NaN,
    # which argmax would pick.
    return (-torch.log1p(-uniform)).clamp_min(torch.finfo(torch.float32).tiny)
