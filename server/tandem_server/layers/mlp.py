"""The gated feed-forward `down(act(gate(x)) * up(x))`: a dense layer's MLP and an MoE block's shared expert; and the
ungated `down(act(up(x)))`."""

from __future__ import annotations

import torch
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.layers.activation import activation
from tandem_server.layers.linear import ColumnParallelLinear, RowParallelLinear, StackedColumns


class GatedMLP(nn.Module):
    """Gate and up split by columns, down by rows across ranks: one all-reduce per call."""

    def __init__(
        self, hidden_size: int, intermediate_size: int, bias: bool, hidden_act: str, parallel: ParallelContext
    ) -> None:
        super().__init__()
        self.gate_proj = ColumnParallelLinear(hidden_size, intermediate_size, bias, parallel)
        self.up_proj = ColumnParallelLinear(hidden_size, intermediate_size, bias, parallel)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias, parallel)
        self.act = activation(hidden_act)
        self.gate_up_proj = StackedColumns((self.gate_proj, self.up_proj))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self._activated(hidden))

    def partial_sum(self, hidden: torch.Tensor) -> torch.Tensor:
        """This rank's term of the output, before the sum over ranks (a layer without bias only)."""
        return self.down_proj.partial_sum(self._activated(hidden))

    def _activated(self, hidden: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(hidden)
        return self.act(gate) * up


class UngatedMLP(nn.Module):
    """`down(act(up(x)))`: up split by columns, down by rows across ranks (Nemotron-H's feed-forward)."""

    def __init__(
        self, hidden_size: int, intermediate_size: int, bias: bool, hidden_act: str, parallel: ParallelContext
    ) -> None:
        super().__init__()
        self.up_proj = ColumnParallelLinear(hidden_size, intermediate_size, bias, parallel)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias, parallel)
        self.act = activation(hidden_act)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.up_proj(hidden)))

    def partial_sum(self, hidden: torch.Tensor) -> torch.Tensor:
        """This rank's term of the output, before the sum over ranks and without the down projection's bias."""
        return self.down_proj.partial_sum(self.act(self.up_proj(hidden)))
