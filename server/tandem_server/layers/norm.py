"""RMSNorm computed in float32 and cast back, as the reference checkpoints were trained."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tandem_server.weights.slicing import load_full


class RMSNorm(nn.Module):
    """Root-mean-square normalisation with a learned per-channel scale.

    `unit_offset` is Gemma's variant: the scale is `1 + weight`, applied in float32 before the cast back.
    `float32_scale` is Gemma 4's: the scale is `weight`, also applied in float32 before the cast back.
    """

    def __init__(self, hidden_size: int, eps: float, unit_offset: bool = False, float32_scale: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset
        self.float32_scale = float32_scale
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.weight.weight_loader = load_full  # type: ignore[attr-defined]  # a loading tag carried on the parameter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (x.shape[-1],)
        if self.unit_offset:
            normed = F.rms_norm(x.float(), shape, None, self.eps)
            return (normed * (1.0 + self.weight.float())).to(x.dtype)
        if self.float32_scale:
            return (F.rms_norm(x.float(), shape, None, self.eps) * self.weight.float()).to(x.dtype)
        if x.dtype == torch.float32:
            # One fused operator computes the reference's float32 terms in the same order.
            return F.rms_norm(x, shape, self.weight, self.eps)
        # The reference rounds the normalised values to the input dtype before scaling by the weight.
        return self.weight * F.rms_norm(x.float(), shape, None, self.eps).to(x.dtype)


def rms_normalise(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS normalisation without a learned scale, computed in float32 and cast back (Gemma 4's value norm)."""
    return F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """RMSNorm scaled by `weight`, then multiplied by `silu(gate)` in float32 (Gated DeltaNet's output norm, over
    each value head); the normalised values are rounded to the input dtype before the scale, as the reference does."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.weight.weight_loader = load_full  # type: ignore[attr-defined]  # a loading tag carried on the parameter

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), (x.shape[-1],), None, self.eps).to(x.dtype)
        return (self.weight * normed * F.silu(gate.float())).to(x.dtype)
