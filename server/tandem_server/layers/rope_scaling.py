"""Rotation angles of every position for each rope type, computed with transformers' operations in its order.

transformers picks longrope's factors and dynamic's base from the length of the whole forward pass; a paged cache
serves positions of many requests in one step and keeps keys rotated in earlier steps, so here each position has
one fixed rotation (the invariant that lets cached keys be reused by any request and prefix):
- longrope: positions below `original_max_position_embeddings` take the short factors, the others the long factors;
- dynamic: position `p` takes the base transformers uses for a sequence of `max(p + 1, max_position_embeddings)`.
Both equal transformers' generation that starts from a prompt within the original context and decodes one token at
a time past it (every decode step of transformers' is then a forward whose length is its position + 1).
"""

from __future__ import annotations

import math

import torch

from tandem_server.layers.rope_config import RopeConfig


def rotation_angles(rope: RopeConfig, rotary_dim: int, num_positions: int) -> torch.Tensor:
    """Float32 angles `[num_positions, rotary_dim / 2]`: position times each pair's frequency."""
    positions = torch.arange(num_positions, dtype=torch.float32)
    if rope.rope_type == "longrope":
        return _longrope_angles(rope, rotary_dim, positions)
    if rope.rope_type == "dynamic":
        return _dynamic_angles(rope, rotary_dim, positions)
    return torch.outer(positions, inverse_frequencies(rotary_dim, rope))


def inverse_frequencies(dim: int, rope: RopeConfig) -> torch.Tensor:
    """Per-pair rotation frequencies in float32 for the types that rotate every position alike."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_scaled(inv_freq, rope)
    if rope.rope_type == "yarn":
        return _yarn_frequencies(dim, rope)
    if rope.rope_type == "proportional":
        return _proportional_frequencies(dim, rope)
    return inv_freq


def _proportional_frequencies(dim: int, rope: RopeConfig) -> torch.Tensor:
    # The rotating pairs' frequencies are spaced over the whole head; the remaining pairs' frequency is zero.
    rotating = int(rope.partial_rotary_factor * dim // 2)
    exponents = torch.arange(0, 2 * rotating, 2, dtype=torch.int64).float() / dim
    inv_freq = torch.cat((1.0 / (rope.theta**exponents), torch.zeros(dim // 2 - rotating)))
    return inv_freq / rope.factor


def _llama3_scaled(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated smoothly.
    old_context = rope.original_max_position_embeddings
    low_freq_wavelen = old_context / rope.low_freq_factor
    high_freq_wavelen = old_context / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_context / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_frequencies(dim: int, rope: RopeConfig) -> torch.Tensor:
    # Pairs turning fewer than beta_slow times over the original context are interpolated (divided by factor),
    # those turning more than beta_fast times kept, with a linear ramp between.
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (rope.factor * pos_freqs)
    low, high = _yarn_correction_range(dim, rope)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    kept = 1 - ramp
    return interpolation * (1 - kept) + extrapolation * kept


def _yarn_correction_range(dim: int, rope: RopeConfig) -> tuple[float, float]:
    def dimension_of(rotations: float) -> float:
        context = rope.original_max_position_embeddings
        return (dim * math.log(context / (rotations * 2 * math.pi))) / (2 * math.log(rope.theta))

    low, high = dimension_of(rope.beta_fast), dimension_of(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _longrope_angles(rope: RopeConfig, rotary_dim: int, positions: torch.Tensor) -> torch.Tensor:
    shape = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    base_freqs = rope.theta**shape
    short = 1.0 / (torch.tensor(rope.short_factor, dtype=torch.float32) * base_freqs)
    long = 1.0 / (torch.tensor(rope.long_factor, dtype=torch.float32) * base_freqs)
    boundary = rope.original_max_position_embeddings
    return torch.cat((torch.outer(positions[:boundary], short), torch.outer(positions[boundary:], long)))


def _dynamic_angles(rope: RopeConfig, rotary_dim: int, positions: torch.Tensor) -> torch.Tensor:
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    context = rope.original_max_position_embeddings
    within = torch.outer(positions[:context], 1.0 / (rope.theta**exponents))
    # transformers grows the base in float32 from a 0-dim int64 sequence length, in this order; one length at a time,
    # as a vectorised power rounds some lengths' bases differently.
    grown = [
        rope.theta
        * ((rope.factor * torch.tensor(length) / context) - (rope.factor - 1)) ** (rotary_dim / (rotary_dim - 2))
        for length in range(context + 1, len(positions) + 1)
    ]
    if not grown:
        return within
    bases = torch.stack(grown)
    beyond = positions[context:, None] * (1.0 / (bases[:, None] ** exponents))
    return torch.cat((within, beyond))
