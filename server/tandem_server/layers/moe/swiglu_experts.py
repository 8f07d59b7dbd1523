"""gpt-oss's routed experts: biased projections around a clamped SwiGLU, held in transformers' layout.

A layer's experts are four stacks, as transformers holds them and the checkpoints name them:
`gate_up_proj [experts, hidden, 2 * I]` with each feature's gate and up columns side by side (gate `2j`, up `2j + 1`),
`gate_up_proj_bias [experts, 2 * I]`, `down_proj [experts, I, hidden]` and `down_proj_bias [experts, hidden]`. The
stacks are `[experts, in, out]`, which is what the grouped GEMM multiplies by, so they are used as loaded. Across ranks
every expert's intermediate features split into contiguous runs: a run of features is a run of interleaved gate/up
columns and of down rows, so each rank reads its slice straight from the checkpoint and returns a partial sum that the
block reduces once; the down bias is added by rank 0 alone.

Dispatch is the plain experts' (`experts.py`): the pairs sorted by expert, one grouped GEMM per projection, each row
weighted and scattered back onto its token, with nothing read on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.linear import rank_run
from tandem_server.layers.moe.experts import GROUPED_GEMM_ALIGNMENT
from tandem_server.layers.moe.routing import ExpertGroups, Routing, group_by_expert
from tandem_server.weights.slicing import CheckpointSlice, sliced_parameter


@dataclass(frozen=True)
class ClampedSwiGLU:
    """`(up + 1) * gate * sigmoid(alpha * gate)` over interleaved gate/up features, the gate clamped from above and
    the up projection on both sides at `limit` (transformers' gpt-oss experts, in its order)."""

    alpha: float
    limit: float

    def __call__(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))


@dataclass(frozen=True)
class ExpertShape:
    """A layer's experts and this rank's run of each one's intermediate features."""

    num_experts: int
    hidden_size: int
    features: range


def expert_shape(
    num_experts: int, hidden_size: int, intermediate_size: int, parallel: ParallelContext, unit: int = 1
) -> ExpertShape:
    """This rank's even share of the intermediate features, in whole runs of `unit` features (a weight format's
    block along them)."""
    if intermediate_size % unit:
        raise ConfigError(
            f"intermediate_size {intermediate_size} is not a multiple of the weights' {unit}-value blocks"
        )
    units = rank_run(None, intermediate_size // unit, parallel, f"runs of {unit} expert intermediate features")
    return ExpertShape(num_experts, hidden_size, range(units.start * unit, units.stop * unit))


class ClampedSwiGLUExperts(nn.Module):
    """Every routed expert of one layer in float: this rank's share of each one's features, with their biases."""

    def __init__(self, shape: ExpertShape, glu: ClampedSwiGLU, parallel: ParallelContext) -> None:
        super().__init__()
        run, experts, hidden = shape.features, shape.num_experts, shape.hidden_size
        self.num_experts = experts
        self.glu = glu
        # Partial sums over ranks are added up by the block: the down bias belongs in exactly one of them.
        self.adds_down_bias = parallel.rank == 0
        columns = range(2 * run.start, 2 * run.stop)
        self.gate_up_proj_bias = sliced_parameter((experts, len(columns)), CheckpointSlice.of(1, columns))
        self.down_proj_bias = sliced_parameter((experts, hidden), None)
        self.num_weights = experts * (3 * len(run) * hidden + 2 * len(run) + hidden)
        self._register_weights(shape)

    def _register_weights(self, shape: ExpertShape) -> None:
        """The float stacks `gate_up_proj` and `down_proj`, this rank's features of each."""
        run, hidden = shape.features, shape.hidden_size
        # Every row stride the grouped GEMMs read is a multiple of 16 bytes (the intermediate rows among them).
        if hidden % GROUPED_GEMM_ALIGNMENT or len(run) % GROUPED_GEMM_ALIGNMENT:
            raise ConfigError(
                f"hidden_size {hidden} with {len(run)} expert intermediate features on this rank: the experts' grouped "
                f"GEMMs need multiples of {GROUPED_GEMM_ALIGNMENT} (serve it on fewer shards)"
            )
        columns = range(2 * run.start, 2 * run.stop)
        self.gate_up_proj = sliced_parameter((shape.num_experts, hidden, len(columns)), CheckpointSlice.of(2, columns))
        self.down_proj = sliced_parameter((shape.num_experts, len(run), hidden), CheckpointSlice.of(1, run))

    def forward(self, hidden: torch.Tensor, routing: Routing) -> torch.Tensor:
        """Each token's chosen experts' outputs, weighted and summed `[tokens, hidden]`; on several ranks, this
        rank's term of that sum."""
        groups = group_by_expert(routing.experts, self.num_experts)
        sorted_experts = routing.experts.reshape(-1)[groups.order]
        outputs = self.project(hidden[groups.tokens], groups, sorted_experts)
        outputs = outputs * routing.weights.reshape(-1)[groups.order].unsqueeze(1)
        return torch.zeros_like(hidden).index_add_(0, groups.tokens, outputs)

    def project(self, rows: torch.Tensor, groups: ExpertGroups, sorted_experts: torch.Tensor) -> torch.Tensor:
        """Each row's expert output (its down bias included on rank 0), for rows sorted by expert."""
        gate_up = F.grouped_mm(rows, self.gate_up_proj, offs=groups.ends) + self.gate_up_proj_bias[sorted_experts]
        outputs = F.grouped_mm(self.glu(gate_up), self.down_proj, offs=groups.ends)
        return outputs + self.down_proj_bias[sorted_experts] if self.adds_down_bias else outputs

    def parameter_count(self) -> int:
        """Elements of this rank's expert weights and biases, as floats."""
        return self.num_weights
