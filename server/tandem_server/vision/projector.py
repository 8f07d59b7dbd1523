"""LLaVA's multimodal projector: two linear layers mapping vision features into the text model's hidden size."""

from __future__ import annotations

import torch
from torch import nn

from tandem_server.layers.activation import activation


class LlavaProjector(nn.Module):
    """`linear_2(act(linear_1(features)))`, replicated on every rank."""

    def __init__(self, in_features: int, text_hidden_size: int, hidden_act: str, bias: bool) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_features, text_hidden_size, bias=bias)
        self.act = activation(hidden_act)
        self.linear_2 = nn.Linear(text_hidden_size, text_hidden_size, bias=bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(features)))
