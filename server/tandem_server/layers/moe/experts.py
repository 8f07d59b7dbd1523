"""A layer's routed experts as stacked 3-D weights, and the capacity-free dispatch of tokens through them.

Each expert's gate and up rows are fused in one stack `gate_up [experts, 2 * intermediate, hidden]` (gate rows
first), its down projection in `down [experts, hidden, intermediate]`. The per-expert parameters the checkpoint names
(`experts.{e}.gate_proj.weight`, ...) are views into the stacks, so loading fills the stacks and nothing is copied
twice. Across ranks every expert's intermediate features split evenly: gate and up by rows (columns of the output),
down by columns, so each rank returns a partial sum that the block reduces once.

Dispatch sorts the step's token-expert pairs by expert, gathers their rows, runs one GEMM pair per expert that
received tokens, weights the rows and scatter-adds them back onto their tokens. A Python loop over the chosen experts
measured as fast as torch's `_grouped_mm` at one and few rows and within noise at more (docs/models.md), and keeps
the stacks in their checkpoint orientation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.layers.activation import Activation, activation
from tandem_server.layers.linear import rank_run
from tandem_server.layers.moe.routing import Routing, group_by_expert
from tandem_server.weights.slicing import CheckpointSlice, load_full

# Each expert's projections by their checkpoint names, in gate_up stacking order, then down.
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


class ExpertProjection(nn.Module):
    """One expert's projection as the checkpoint names it: its `weight` is a view into the experts' stack."""

    def __init__(self, weight: torch.Tensor, part: CheckpointSlice) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight.weight_loader = load_full  # type: ignore[attr-defined]  # a loading tag carried on the parameter
        self.weight.checkpoint_slice = part  # type: ignore[attr-defined]  # a loading tag carried on the parameter


class Expert(nn.Module):
    """The checkpoint names of one expert: `gate_proj`, `up_proj` and `down_proj`, each with a `weight`."""

    def __init__(self, gate: ExpertProjection, up: ExpertProjection, down: ExpertProjection) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate, up, down


class RoutedExperts(nn.ModuleList):
    """Every routed expert of one layer, this rank's share of each one's intermediate features."""

    gate_up: torch.Tensor
    down: torch.Tensor

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        hidden_act: str,
        parallel: ParallelContext,
    ) -> None:
        super().__init__()
        run = rank_run(None, intermediate_size, parallel, "expert intermediate features")
        local = len(run)
        self.num_experts = num_experts
        self.act: Activation = activation(hidden_act)
        self.register_buffer("gate_up", torch.empty(num_experts, 2 * local, hidden_size), persistent=False)
        self.register_buffer("down", torch.empty(num_experts, hidden_size, local), persistent=False)
        rows, columns = CheckpointSlice.of(0, run), CheckpointSlice.of(1, run)
        for e in range(num_experts):
            gate = ExpertProjection(self.gate_up[e, :local], rows)
            up = ExpertProjection(self.gate_up[e, local:], rows)
            self.append(Expert(gate, up, ExpertProjection(self.down[e], columns)))

    def forward(self, hidden: torch.Tensor, routing: Routing) -> torch.Tensor:
        """Each token's chosen experts' outputs, weighted and summed `[tokens, hidden]`; on several ranks, this
        rank's term of that sum."""
        groups = group_by_expert(routing.experts, self.num_experts)
        rows = hidden[groups.tokens]
        outputs = torch.empty_like(rows)
        for expert, start, stop in groups.runs:
            gate, up = F.linear(rows[start:stop], self.gate_up[expert]).chunk(2, dim=-1)
            outputs[start:stop] = F.linear(self.act(gate) * up, self.down[expert])
        outputs.mul_(routing.weights.reshape(-1)[groups.order].unsqueeze(1))
        return torch.zeros_like(hidden).index_add_(0, groups.tokens, outputs)

    def parameter_count(self) -> int:
        """Elements of this rank's expert weights."""
        return self.gate_up.numel() + self.down.numel()
