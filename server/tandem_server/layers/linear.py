"""Linear layers whose parameters read only their tensor-parallel rank's slice of the checkpoint."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.gemm import GemmModule
from tandem_server.weights.slicing import CheckpointSlice, sliced_parameter


def rank_run(run: range | None, total: int, parallel: ParallelContext, what: str) -> range:
    """This rank's contiguous run of `total` items (`run`, else an even split); empty runs are a start-up error."""
    run = parallel.partition(total) if run is None else run
    if not 0 <= run.start < run.stop <= total or run.step != 1:
        raise ConfigError(
            f"rank {parallel.rank} of {parallel.world_size} gets {what} [{run.start}, {run.stop}) of {total}; "
            f"each rank needs a non-empty contiguous part (use fewer shards)"
        )
    return run


class ColumnParallelLinear(nn.Module):
    """Output features split across ranks; each rank returns its own slice of the output.

    `output_range` picks this rank's output features (default: an even split, the first ranks one larger).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        parallel: ParallelContext,
        output_range: range | None = None,
    ) -> None:
        super().__init__()
        run = rank_run(output_range, out_features, parallel, "output features")
        # The unsplit sizes: what a checkpoint tensor of this layer (or an adapter of it) holds on every rank.
        self.in_features, self.out_features = in_features, out_features
        self.output_range = run
        self.weight = sliced_parameter((len(run), in_features), CheckpointSlice.of(0, run))
        self.bias = sliced_parameter((len(run),), CheckpointSlice.of(0, run)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(GemmModule):
    """Input features split across ranks; partial outputs are summed so every rank holds the full output.

    `input_range` picks this rank's input features and must match the column layer feeding it.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        parallel: ParallelContext,
        input_range: range | None = None,
    ) -> None:
        super().__init__()
        run = rank_run(input_range, in_features, parallel, "input features")
        # The unsplit sizes: what a checkpoint tensor of this layer (or an adapter of it) holds on every rank.
        self.in_features, self.out_features = in_features, out_features
        self.input_range = run
        self.parallel = parallel
        self.weight = sliced_parameter((out_features, len(run)), CheckpointSlice.of(1, run))
        # The bias is added once, after the reduction, so it is replicated rather than split.
        self.bias = sliced_parameter((out_features,), None) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.parallel.all_reduce(self.partial_sum(x))
        return out if self.bias is None else out + self.bias

    def partial_sum(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's term of the output, before the sum over ranks and without the bias: for a block that sums
        several such terms first and reduces once."""
        return self.gemm(x, None)


class ReplicatedLinear(nn.Module):
    """A small linear layer every rank holds whole (an MoE router, a shared expert's gate, a latent projection)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = sliced_parameter((out_features, in_features), None)
        self.bias = sliced_parameter((out_features,), None) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def partial_sum(self, x: torch.Tensor) -> torch.Tensor:
        """The layer without its bias, applied to one rank's term of a sum over ranks: its term of the output, to
        which the bias is added once after the sum."""
        return F.linear(x, self.weight)


class StackedColumns(GemmModule):
    """Column layers fused into one weight (and bias) holding their output rows in order: one GEMM computes all.

    Built before the checkpoint loads: each layer's parameters become views into the uninitialised stack, so
    loading a layer fills its rows and nothing is copied twice. A stack whose weights all arrive quantized stays on
    meta, taking no memory (`meta_storage`). The stack's tensors are buffers outside the state dict, since the
    checkpoint names the layers.
    """

    bias: torch.Tensor | None

    def __init__(self, linears: Sequence[ColumnParallelLinear]) -> None:
        super().__init__()
        # A tuple, not a ModuleList: the layers stay registered where their checkpoint names say.
        self.layers = tuple(linears)
        self.sizes = [linear.weight.shape[0] for linear in linears]
        device = linears[0].weight.device
        self.register_buffer("weight", self._stacked("weight", device), persistent=False)
        has_bias = all(linear.bias is not None for linear in linears)
        self.register_buffer("bias", self._stacked("bias", device) if has_bias else None, persistent=False)

    def allocate(self, name: str, device: torch.device) -> None:
        """Gives stack `name` ("weight" or "bias"), built on meta, its storage on `device`; the layers' parameters
        stay the same objects, views into it again."""
        setattr(self, name, self._stacked(name, device))

    def _stacked(self, name: str, device: torch.device) -> torch.Tensor:
        parts = [getattr(layer, name) for layer in self.layers]
        stack = parts[0].new_empty((sum(part.shape[0] for part in parts), *parts[0].shape[1:]), device=device)
        offset = 0
        for part in parts:
            swap_storage(part, stack[offset : offset + part.shape[0]])
            offset += part.shape[0]
        return stack

    def weight_parts(self) -> list[torch.Tensor]:
        return [layer.weight for layer in self.layers]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each stacked layer's output, in stacking order."""
        return self.gemm(x, self.bias).split(self.sizes, dim=-1)


def swap_storage(param: nn.Parameter, storage: torch.Tensor) -> None:
    """Makes `param` hold `storage` (no copy), keeping the object, so its loader, checkpoint slice and every module
    sharing it (a tied LM head) stay as they were."""
    replacement = nn.Parameter(storage, requires_grad=False)
    replacement.__dict__.update(param.__dict__)
    torch.utils.swap_tensors(param, replacement)
