"""Rotary position embeddings (rotate-half layout, optionally partial) with default, linear and llama3 scaling."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tandem_server.errors import ConfigError

ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary parameters as read from config.json (`rope_parameters`, or `rope_theta` + `rope_scaling`)."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # Share of each head's dimensions that is rotated; the rest passes through unchanged.
    partial_rotary_factor: float = 1.0

    @classmethod
    def from_hf(cls, config: dict[str, Any], layer_type: str | None = None) -> RopeConfig:
        """Accepts both the current `rope_parameters` and the older `rope_theta`/`rope_scaling` spellings.

        With `layer_type`, per-layer-type `rope_parameters` (`{"sliding_attention": {...}, ...}`) are honoured.
        """
        params = dict(config.get("rope_scaling") or {})
        rope_parameters = config.get("rope_parameters") or {}
        if layer_type is not None and isinstance(rope_parameters.get(layer_type), dict):
            rope_parameters = rope_parameters[layer_type]
        params.update(rope_parameters)
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise ConfigError(f"unsupported rope scaling {rope_type!r}; supported: {', '.join(ROPE_TYPES)}")
        defaults = cls()
        return cls(
            theta=float(params.get("rope_theta", config.get("rope_theta", defaults.theta))),
            rope_type=rope_type,
            factor=float(params.get("factor", defaults.factor)),
            low_freq_factor=float(params.get("low_freq_factor", defaults.low_freq_factor)),
            high_freq_factor=float(params.get("high_freq_factor", defaults.high_freq_factor)),
            original_max_position_embeddings=int(
                params.get("original_max_position_embeddings", defaults.original_max_position_embeddings)
            ),
            partial_rotary_factor=float(
                params.get("partial_rotary_factor", config.get("partial_rotary_factor", defaults.partial_rotary_factor))
            ),
        )

    def rotary_dim(self, head_dim: int) -> int:
        """How many leading dimensions of each head are rotated."""
        return int(head_dim * self.partial_rotary_factor)


def inverse_frequencies(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    """Per-pair rotation frequencies in float32, scaled as `rope.rope_type` prescribes."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_scaled(inv_freq, rope)
    return inv_freq


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


@dataclass(frozen=True)
class RotaryAngles:
    """One step's rotation for every token, in the activations' dtype: `cos` is `[tokens, 1, rotary_dim]` (each
    pair's cosine in both halves), `signed_sin` the same with the first half negated. Computed once per step and
    shared by every layer using the table."""

    cos: torch.Tensor
    signed_sin: torch.Tensor

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """`x` `[tokens, heads, head_dim]` with its leading `rotary_dim` dimensions rotated (rotate-half layout).

        Swapping the halves and multiplying by `signed_sin` gives `(-second, first) * sin`, so this is the reference's
        `x * cos + rotate_half(x) * sin` term by term, with the same roundings."""
        rotary_dim = self.cos.shape[-1]
        whole = rotary_dim == x.shape[-1]
        rotated = x if whole else x[..., :rotary_dim]
        turned = rotated * self.cos + rotated.roll(rotary_dim // 2, dims=-1) * self.signed_sin
        return turned if whole else torch.cat((turned, x[..., rotary_dim:]), dim=-1)


class RotaryEmbedding(nn.Module):
    """A float32 cos/sin table over every position, from which each step takes its tokens' `RotaryAngles`."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, head_dim: int, max_positions: int, rope: RopeConfig) -> None:
        super().__init__()
        inv_freq = inverse_frequencies(rope.rotary_dim(head_dim), rope).to(torch.get_default_device())
        positions = torch.arange(max_positions, dtype=torch.float32, device=inv_freq.device)
        freqs = torch.outer(positions, inv_freq)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def angles(self, positions: torch.Tensor, dtype: torch.dtype) -> RotaryAngles:
        """The rotation of tokens at `positions`, cast to `dtype` as the reference casts its cos/sin."""
        cos = self.cos[positions].unsqueeze(1).to(dtype)
        sin = self.sin[positions].unsqueeze(1).to(dtype)
        return RotaryAngles(torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1))
