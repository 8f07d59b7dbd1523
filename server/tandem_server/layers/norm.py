"""RMSNorm computed in float32 and cast back, as the reference checkpoints were trained."""

from __future__ import annotations

import torch
from torch import nn

from tandem_server.weights.slicing import load_full


class RMSNorm(nn.Module):
    """Root-mean-square normalisation with a learned per-channel scale.

    `unit_offset` is Gemma's variant: the scale is `1 + weight`, applied in float32 before the cast back.
    """

    def __init__(self, hidden_size: int, eps: float, unit_offset: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.weight.weight_loader = load_full

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:
            return (x32 * (1.0 + self.weight.float())).to(input_dtype)
        return self.weight * x32.to(input_dtype)
