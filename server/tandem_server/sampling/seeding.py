"""Random draws that depend only on (request seed, token position), never on the batch.

A sampled row draws Exp(1) noise over the vocabulary and takes argmax(probs / noise) (an exponential race): only a
genuine near-tie between two tokens' ratios can flip a draw when another batch shape rounds the logits differently.
The noise comes from a 64-bit key per row, mixed from (seed, position) on the host:
- on the CPU, a generator per row seeded with the key (a generator costs nothing to launch there);
- on CUDA, a keyed integer hash of each token's index, computed for every row at once, so the kernels a step queues
  do not grow with its batch (a generator per row costs several launches each).
Both are fixed per (seed, position) on their device, so a preempted and recomputed request draws the same tokens, and
every tensor-parallel rank draws alike.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1
_MASK32 = (1 << 32) - 1
# Odd multipliers below 2**31: a 32-bit value times one stays below 2**63, so int64 arithmetic never overflows.
_MULTIPLIERS = (0x7FEB352D, 0x5BD1E995)
_HASH_UNIFORM_BITS = 24
# Noise is clamped here: a masked token (probability 0) then scores 0, never 0/0 = NaN, which argmax would pick.
_TINY = torch.finfo(torch.float32).tiny


def mix_seed(seed: int, position: int) -> int:
    """A 63-bit key from (seed, position) via splitmix64 finalisation."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def key_pairs(keys: list[int]) -> torch.Tensor:
    """[rows, 2] int64 on the host: each key's low and high 32 bits, the hash's two round keys."""
    return torch.tensor([[key & _MASK32, key >> 32] for key in keys], dtype=torch.int64).reshape(-1, 2)


def generator_noise(keys: list[int], vocab_size: int) -> torch.Tensor:
    """[rows, vocab] Exp(1) noise on the CPU, one generator per row (at least one row)."""
    rows = []
    for key in keys:
        generator = torch.Generator()
        generator.manual_seed(key)
        uniform = torch.rand(vocab_size, generator=generator, dtype=torch.float32)
        rows.append(-torch.log1p(-uniform))
    return torch.stack(rows).clamp_min(_TINY)


def _mix32(values: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mix of values in [0, 2**32), kept in int64 so every shift is a logical one."""
    for multiplier in _MULTIPLIERS:
        values = ((values ^ (values >> 16)) * multiplier) & _MASK32
    return values ^ (values >> 15)


def hashed_uniform(pairs: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[rows, vocab] float32 uniform draws in (0, 1), never 0 or 1, from each row's key pair (on its device)."""
    tokens = torch.arange(vocab_size, device=pairs.device, dtype=torch.int64)
    mixed = _mix32(_mix32(tokens ^ pairs[:, :1]) ^ pairs[:, 1:])
    top_bits = (mixed >> (32 - _HASH_UNIFORM_BITS)).to(torch.float32)
    return (top_bits + 0.5) * (1.0 / (1 << _HASH_UNIFORM_BITS))


def hashed_noise(pairs: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[rows, vocab] Exp(1) noise from each row's key pair, every row in the same few kernels."""
    return (-torch.log(hashed_uniform(pairs, vocab_size))).clamp_min(_TINY)
