"""Linear layers whose parameters slice checkpoint tensors for their tensor-parallel rank at load time."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tandem_server.distributed import ParallelContext


def load_full(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Copies a replicated tensor that must match the parameter's shape exactly."""
    if param.shape != loaded.shape:
        raise ValueError(f"expected shape {tuple(param.shape)}, checkpoint has {tuple(loaded.shape)}")
    param.data.copy_(loaded)


def _load_slice(param: nn.Parameter, loaded: torch.Tensor, dim: int, rank: int) -> None:
    size = param.shape[dim]
    load_full(param, loaded.narrow(dim, rank * size, size))


def _parameter(shape: tuple[int, ...]) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape), requires_grad=False)


class ReplicatedLinear(nn.Module):
    """A linear layer held whole by every rank."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.weight = _parameter((out_features, in_features))
        self.weight.weight_loader = load_full
        self.bias = _parameter((out_features,)) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = load_full

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class ColumnParallelLinear(nn.Module):
    """Output features split across ranks; each rank returns its own slice of the output."""

    def __init__(self, in_features: int, out_features: int, bias: bool, parallel: ParallelContext) -> None:
        super().__init__()
        local_out = parallel.shard_size(out_features, "output features")
        rank = parallel.rank
        self.weight = _parameter((local_out, in_features))
        self.weight.weight_loader = lambda p, t: _load_slice(p, t, 0, rank)
        self.bias = _parameter((local_out,)) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = lambda p, t: _load_slice(p, t, 0, rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Input features split across ranks; partial outputs are summed so every rank holds the full output."""

    def __init__(self, in_features: int, out_features: int, bias: bool, parallel: ParallelContext) -> None:
        super().__init__()
        local_in = parallel.shard_size(in_features, "input features")
        rank = parallel.rank
        self.parallel = parallel
        self.weight = _parameter((out_features, local_in))
        self.weight.weight_loader = lambda p, t: _load_slice(p, t, 1, rank)
        # The bias is added once, after the reduction, so it is replicated rather than split.
        self.bias = _parameter((out_features,)) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = load_full

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.parallel.all_reduce(F.linear(x, self.weight))
        return out if self.bias is None else out + self.bias
