"""Rotary position embeddings (rotate-half or interleaved pairs, optionally partial) from a per-position table."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tandem_server.layers.rope_config import RopeConfig
from tandem_server.layers.rope_scaling import rotation_angles


@dataclass(frozen=True)
class RotaryAngles:
    """One step's rotation for every token, in the activations' dtype: `cos` is `[tokens, 1, rotary_dim]` (each
    pair's cosine at both of its dimensions), `signed_sin` the same with the sine negated at each pair's first
    dimension. Computed once per step and shared by every layer using the table."""

    cos: torch.Tensor
    signed_sin: torch.Tensor
    # Pairs are adjacent dimensions (GLM) rather than one from each half.
    interleaved: bool = False

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """`x` `[tokens, heads, head_dim]` with its leading `rotary_dim` dimensions rotated.

        Swapping each pair's dimensions and multiplying by `signed_sin` gives the reference's `rotate_half(x) * sin`
        term by term, so this is its `x * cos + rotate_half(x) * sin` with the same roundings."""
        rotary_dim = self.cos.shape[-1]
        if rotary_dim == 0:
            return x
        whole = rotary_dim == x.shape[-1]
        rotated = x if whole else x[..., :rotary_dim]
        if self.interleaved:
            partners = rotated.unflatten(-1, (rotary_dim // 2, 2)).flip(-1).flatten(-2)
        else:
            partners = rotated.roll(rotary_dim // 2, dims=-1)
        turned = rotated * self.cos + partners * self.signed_sin
        return turned if whole else torch.cat((turned, x[..., rotary_dim:]), dim=-1)


class RotaryEmbedding(nn.Module):
    """A float32 cos/sin table over every position, from which each step takes its tokens' `RotaryAngles`."""

    cos: torch.Tensor
    sin: torch.Tensor
    pair_axes: torch.Tensor

    def __init__(self, head_dim: int, max_positions: int, rope: RopeConfig) -> None:
        super().__init__()
        rope.check_head_dim(head_dim)
        self.interleaved = rope.interleaved
        angles = rotation_angles(rope, rope.rotary_dim(head_dim), max_positions)
        # The reference scales cos and sin in float32 before casting them (yarn's and longrope's attention factor).
        self.register_buffer("cos", angles.cos() * rope.attention_factor, persistent=False)
        self.register_buffer("sin", angles.sin() * rope.attention_factor, persistent=False)
        # Multimodal rotary: the position axis (0 temporal, 1 height, 2 width) each rotated pair reads.
        axes = [index % 3 for index, pairs in enumerate(rope.mrope_section) for _ in range(pairs)]
        self.register_buffer("pair_axes", torch.tensor(axes, dtype=torch.long), persistent=False)

    def angles(self, positions: torch.Tensor, dtype: torch.dtype) -> RotaryAngles:
        """The rotation of tokens at `positions` (`[tokens]`, or `[3, tokens]` temporal, height and width positions
        under multimodal rotary), cast to `dtype` as the reference casts its cos/sin."""
        if positions.dim() == 2:
            cos, sin = self._multimodal_table(positions)
        else:
            cos, sin = self.cos[positions], self.sin[positions]
        cos, sin = cos.unsqueeze(1).to(dtype), sin.unsqueeze(1).to(dtype)
        if self.interleaved:
            return RotaryAngles(cos.repeat_interleave(2, dim=-1), torch.stack((-sin, sin), dim=-1).flatten(-2), True)
        return RotaryAngles(torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1))

    def _multimodal_table(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The float32 cos and sin `[tokens, pairs]` of each pair at the position of its own axis."""
        axes = self.pair_axes.expand(1, positions.shape[1], -1)
        cos = self.cos[positions].gather(0, axes).squeeze(0)
        sin = self.sin[positions].gather(0, axes).squeeze(0)
        return cos, sin
