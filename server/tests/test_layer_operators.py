"""The rotary and RMSNorm operators give the reference's values bit for bit, in each dtype and layout they serve."""

from __future__ import annotations

import pytest
import torch
from tandem_server.layers.norm import RMSNorm
from tandem_server.layers.rope_config import RopeConfig
from tandem_server.layers.rotary import RotaryEmbedding

HEAD_DIM, MAX_POSITIONS = 64, 512


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _reference_rotary(x: torch.Tensor, positions: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    # The reference layout: cos/sin of [freqs, freqs] in float32, cast to the activations' dtype; the dimensions past
    # the rotary ones pass through.
    rotary_dim = rope.rotary_dim(x.shape[-1])
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    freqs = torch.outer(positions.float(), inv_freq)
    angles = torch.cat((freqs, freqs), dim=-1)
    cos, sin = angles.cos().to(x.dtype).unsqueeze(1), angles.sin().to(x.dtype).unsqueeze(1)
    rotated, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((rotated * cos + _rotate_half(rotated) * sin, passed), dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_rotation_equals_the_reference_rotate_half_bit_for_bit(dtype: torch.dtype, partial: float) -> None:
    rope = RopeConfig(theta=10_000.0, partial_rotary_factor=partial)
    table = RotaryEmbedding(HEAD_DIM, MAX_POSITIONS, rope)
    positions = torch.tensor([0, 1, 7, 130, 511, 42])
    # Query-shaped and key-shaped heads, and a view with strides as the fused QKV output's split leaves it.
    fused = torch.randn(positions.shape[0], 12 * HEAD_DIM, generator=torch.Generator().manual_seed(0)).to(dtype)
    query = fused[:, : 9 * HEAD_DIM].view(-1, 9, HEAD_DIM)
    key = fused[:, 9 * HEAD_DIM :].view(-1, 3, HEAD_DIM)
    angles = table.angles(positions, dtype)
    for heads in (query, key):
        rotated = angles.rotate(heads)
        assert rotated.dtype == dtype and rotated.is_contiguous()
        assert torch.equal(rotated, _reference_rotary(heads, positions, rope))


def test_rotation_at_position_zero_leaves_heads_unchanged() -> None:
    table = RotaryEmbedding(HEAD_DIM, MAX_POSITIONS, RopeConfig())
    heads = torch.randn(1, 3, HEAD_DIM)
    assert torch.equal(table.angles(torch.tensor([0]), torch.float32).rotate(heads), heads)


def _reference_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if unit_offset:
        return (x32 * (1.0 + weight.float())).to(x.dtype)
    return weight * x32.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("unit_offset", [False, True])
def test_rms_norm_equals_the_reference_bit_for_bit(dtype: torch.dtype, unit_offset: bool) -> None:
    generator = torch.Generator().manual_seed(1)
    norm = RMSNorm(576, 1e-5, unit_offset)
    norm.weight.data = torch.randn(576, generator=generator).to(dtype)
    for rows in (1, 5, 64):
        x = (torch.randn(rows, 576, generator=generator) * 3).to(dtype)
        out = norm(x)
        assert out.dtype == dtype
        assert torch.equal(out, _reference_norm(x, norm.weight, 1e-5, unit_offset))
