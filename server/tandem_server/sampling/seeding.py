"""Random draws that depend only on (request seed, token position), never on the batch.

Each sampled row gets a 64-bit key from its (seed, position) on the host; the noise over the vocabulary is a keyed
integer hash of each token's index, computed for every row at once. The work queued on the device is the same
whatever the number of rows (no generator per row), and the same integer arithmetic gives the same draws on every
device and every tensor-parallel rank.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1
_MASK32 = (1 << 32) - 1
# Odd multipliers below 2**31: a 32-bit value times one of them stays below 2**63, so int64 arithmetic never
# overflows on any device.
_MULTIPLIERS = (0x7FEB352D, 0x5BD1E995)
_UNIFORM_BITS = 24


def mix_seed(seed: int, position: int) -> int:
    """A 63-bit key from (seed, position) via splitmix64 finalisation."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def noise_key_pairs(keys: list[int]) -> torch.Tensor:
    """[rows, 2] int64 on the host: each key's low and high 32 bits, the two rounds' keys."""
    return torch.tensor([[key & _MASK32, (key >> 32) & _MASK32] for key in keys], dtype=torch.int64).reshape(-1, 2)


def _hash32(values: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mix of values in [0, 2**32), kept in int64 so every shift is a logical one."""
    for multiplier in _MULTIPLIERS:
        values = ((values ^ (values >> 16)) * multiplier) & _MASK32
    return values ^ (values >> 15)


def uniform_noise(key_pairs: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[rows, vocab] float32 uniform draws in (0, 1), never 0 or 1, from each row's key pair."""
    tokens = torch.arange(vocab_size, device=key_pairs.device, dtype=torch.int64)
    mixed = _hash32(_hash32(tokens ^ key_pairs[:, :1]) ^ key_pairs[:, 1:])
    top_bits = (mixed >> (32 - _UNIFORM_BITS)).to(torch.float32)
    return (top_bits + 0.5) * (1.0 / (1 << _UNIFORM_BITS))


def exponential_noise(key_pairs: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Exp(1) noise over the vocabulary, one row per key pair; argmax(probs / noise) is a draw from probs."""
    # Clamped, a masked token (probability 0) scores 0, never 0/0 = NaN, which argmax would pick.
    return (-torch.log(uniform_noise(key_pairs, vocab_size))).clamp_min(torch.finfo(torch.float32).tiny)
