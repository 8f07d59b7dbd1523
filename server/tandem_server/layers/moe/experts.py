"""A layer's routed experts as stacked 3-D weights, and the capacity-free dispatch of tokens through them.

Each expert's gate and up rows are fused in one stack `gate_up [experts, 2 * intermediate, hidden]` (gate rows
first), its down projection in `down [experts, hidden, intermediate]`, the intermediate features padded with zeros
to a multiple of 8 (the grouped GEMM's row alignment). Ungated experts (`down(act(up(x)))`, Nemotron-H's) hold only
their up rows in `gate_up [experts, intermediate, hidden]`. The per-expert parameters the checkpoint names
(`experts.{e}.gate_proj.weight`, ...) are views into the stacks, so loading fills the stacks and nothing is copied
twice. Across ranks every expert's intermediate features split evenly: gate and up by rows (columns of the output),
down by columns, so each rank returns a partial sum that the block reduces once. Under expert parallelism a rank
instead holds its contiguous share of the experts whole: the stacks hold only those, the other experts' checkpoint
tensors are skipped at load, and the rank's partial sum is its experts' outputs.

Dispatch sorts the step's token-expert pairs by expert, gathers their rows, multiplies each expert's run of rows by
its weights in one grouped GEMM (`F.grouped_mm`, the stacks transposed as views), weights the rows and scatter-adds
them back onto their tokens. No shape depends on the routing and nothing syncs with the host, so the block compiles.
On the CPU torch's grouped GEMM is a loop over the experts inside one operator: up to 32 tokens it measured as fast
as a Python loop over the chosen experts, and 2-20 times faster than batched GEMMs over padded groups; on 256-token
bfloat16 steps the loop was 1.2-1.7 times faster (docs/models.md).

On a CUDA device SiLU experts run through Tandem's fused Triton kernels instead (`triton_grouped`), when Triton is
installed; other activations, and every other device, keep the grouped GEMM. Experts a checkpoint holds quantized
(GGUF blocks, float8) are served by `quantized_experts` once quantization hands them over; the float stacks are then
released (or never get storage).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.activation import Activation, activation
from tandem_server.layers.gemm import release_storage
from tandem_server.layers.linear import rank_run, swap_storage
from tandem_server.layers.moe.quantized_experts import QuantizedExperts
from tandem_server.layers.moe.routing import Routing, group_by_expert
from tandem_server.weights.slicing import CheckpointSlice, load_full

# The activations the fused CUDA kernel computes (`silu(gate) * up`).
FUSED_ACTIVATIONS = ("silu", "swish")
# Elements every row stride of a grouped GEMM's operands must be a multiple of (16 bytes of 16-bit values).
GROUPED_GEMM_ALIGNMENT = 8


@dataclass(frozen=True)
class ExpertActivation:
    """What an expert's input projection becomes before its down projection: `act(gate) * up` over its gate rows then
    its up rows, or `act(up)` for an ungated expert."""

    act: Activation
    gated: bool = True

    def __call__(self, projected: torch.Tensor) -> torch.Tensor:
        if not self.gated:
            return self.act(projected)
        gate, up = projected.chunk(2, dim=-1)
        return self.act(gate) * up


class ExpertProjection(nn.Module):
    """One expert's projection as the checkpoint names it: its `weight` is a view into the experts' stack."""

    def __init__(self, weight: torch.Tensor, part: CheckpointSlice) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight.weight_loader = load_full  # type: ignore[attr-defined]  # a loading tag carried on the parameter
        self.weight.checkpoint_slice = part  # type: ignore[attr-defined]  # a loading tag carried on the parameter


def _skip(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Loads nothing: the expert is another rank's."""


def _absent_projection() -> ExpertProjection:
    """The checkpoint name of a projection another rank holds: an empty weight that reads none of its tensor."""
    projection = ExpertProjection(torch.empty(0), CheckpointSlice(0, 0, 0))
    projection.weight.weight_loader = _skip  # type: ignore[attr-defined]  # a loading tag carried on the parameter
    return projection


class Expert(nn.Module):
    """The checkpoint names of one expert: `gate_proj` (a gated expert's), `up_proj` and `down_proj`, each with a
    `weight`."""

    def __init__(self, gate: ExpertProjection | None, up: ExpertProjection, down: ExpertProjection) -> None:
        super().__init__()
        if gate is not None:
            self.gate_proj = gate
        self.up_proj, self.down_proj = up, down

    def weights(self) -> tuple[nn.Parameter, ...]:
        """The expert's input projections' weights in stacking order, then its down projection's."""
        inputs = (self.gate_proj, self.up_proj) if hasattr(self, "gate_proj") else (self.up_proj,)
        return (*(projection.weight for projection in inputs), self.down_proj.weight)


class RoutedExperts(nn.ModuleList):
    """Every routed expert of one layer, this rank's share of each one's intermediate features; `gated` False: each
    expert is `down(act(up(x)))`."""

    gate_up: torch.Tensor
    down: torch.Tensor

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        hidden_act: str,
        parallel: ParallelContext,
        gated: bool = True,
    ) -> None:
        super().__init__()
        if hidden_size % GROUPED_GEMM_ALIGNMENT:
            raise ConfigError(
                f"hidden_size {hidden_size}: the experts' grouped GEMMs need a multiple of {GROUPED_GEMM_ALIGNMENT}"
            )
        # Experts split across ranks keep their features whole; otherwise each rank holds a run of every expert's.
        self.num_experts = num_experts
        self.expert_run = parallel.expert_run(num_experts)
        run = (
            range(intermediate_size)
            if self.split_across_ranks
            else rank_run(None, intermediate_size, parallel, "expert intermediate features")
        )
        local = len(run)
        # Zero features pad each expert to whole rows of the grouped GEMM; they add exact zeros to every output.
        padded = -(-local // GROUPED_GEMM_ALIGNMENT) * GROUPED_GEMM_ALIGNMENT
        held = len(self.expert_run)
        self.local_features, self.padded_features = local, padded
        self.quantized: QuantizedExperts | None = None
        # The projections into each expert's features (gate and up, or up alone) stacked in `gate_up`.
        inputs = 2 if gated else 1
        self.num_weights = held * (inputs + 1) * local * hidden_size
        self.act = ExpertActivation(activation(hidden_act), gated)
        self.fused_on_cuda = (
            gated
            and hidden_act in FUSED_ACTIVATIONS
            and not self.split_across_ranks
            and importlib.util.find_spec("triton") is not None
        )
        self.register_buffer("gate_up", torch.empty(held, inputs * padded, hidden_size), persistent=False)
        self.register_buffer("down", torch.empty(held, hidden_size, padded), persistent=False)
        self._zero_padding()
        rows, columns = CheckpointSlice.of(0, run), CheckpointSlice.of(1, run)
        for e in range(num_experts):
            if e not in self.expert_run:
                gate = _absent_projection() if gated else None
                self.append(Expert(gate, _absent_projection(), _absent_projection()))
                continue
            i = e - self.expert_run.start
            projections = [ExpertProjection(view, rows) for view in self._input_views(i)]
            gate = projections[0] if gated else None
            self.append(Expert(gate, projections[-1], ExpertProjection(self.down[i, :, :local], columns)))

    def _input_views(self, held_expert: int) -> list[torch.Tensor]:
        """The rows of `gate_up` each of an expert's input projections fills: gate then up, or up alone."""
        local, padded = self.local_features, self.padded_features
        starts = range(0, self.gate_up.shape[1], padded)
        return [self.gate_up[held_expert, start : start + local] for start in starts]

    def _zero_padding(self) -> None:
        local, padded = self.local_features, self.padded_features
        for start in range(0, self.gate_up.shape[1], padded):
            self.gate_up[:, start + local : start + padded].zero_()
        self.down[:, :, local:].zero_()

    @property
    def split_across_ranks(self) -> bool:
        """True when this rank holds only some of the experts (expert parallelism)."""
        return len(self.expert_run) < self.num_experts

    def projections(self) -> list[tuple[nn.Parameter, ...]]:
        """The `(gate, up, down)` weight parameters (ungated: `(up, down)`) of each expert this rank holds, in expert
        order."""
        experts: list[Expert] = [expert for expert in self if isinstance(expert, Expert)]
        return [expert.weights() for expert in experts[self.expert_run.start : self.expert_run.stop]]

    def allocate(self, device: torch.device) -> None:
        """Gives the stacks, built on meta, storage on `device`; the experts' parameters stay the same objects, views
        into them again."""
        self.gate_up = torch.empty(self.gate_up.shape, dtype=self.gate_up.dtype, device=device)
        self.down = torch.empty(self.down.shape, dtype=self.down.dtype, device=device)
        self._zero_padding()
        for e, (*inputs, down) in enumerate(self.projections()):
            for projection, view in zip(inputs, self._input_views(e), strict=True):
                swap_storage(projection, view)
            swap_storage(down, self.down[e, :, : self.local_features])

    def use_quantized(self, quantized: QuantizedExperts) -> None:
        """Serves the experts from `quantized` from now on and releases the float stacks' memory."""
        self.quantized = quantized
        for tensor in [param for parts in self.projections() for param in parts] + [self.gate_up, self.down]:
            release_storage(tensor)

    def forward(self, hidden: torch.Tensor, routing: Routing) -> torch.Tensor:
        """Each token's chosen experts' outputs, weighted and summed `[tokens, hidden]`; on several ranks, this
        rank's term of that sum."""
        if self.quantized is not None:
            return self.quantized.forward(hidden, routing, self.act)
        if self.fused_on_cuda and hidden.device.type == "cuda":
            return fused_experts_on_cuda(hidden, routing, self.gate_up, self.down)
        return self.grouped_mm(hidden, routing)

    def grouped_mm(self, hidden: torch.Tensor, routing: Routing) -> torch.Tensor:
        """The dispatch through torch's grouped GEMM, on any device. With the experts split across ranks, this rank's
        experts sort first; the grouped GEMMs stop at their last pair and the rows after it (other ranks' pairs, left
        undefined) are dropped, so no shape depends on the routing."""
        held = self.expert_run
        experts = (routing.experts - held.start) % self.num_experts if self.split_across_ranks else routing.experts
        groups = group_by_expert(experts, self.num_experts)
        ends = groups.ends[: len(held)]
        rows = hidden[groups.tokens]
        gate_up = F.grouped_mm(rows, self.gate_up.transpose(1, 2), offs=ends)
        outputs = F.grouped_mm(self.act(gate_up), self.down.transpose(1, 2), offs=ends)
        outputs = outputs * routing.weights.reshape(-1)[groups.order].unsqueeze(1)
        if self.split_across_ranks:
            held_pairs = torch.arange(outputs.shape[0], device=outputs.device) < ends[-1]
            outputs = torch.where(held_pairs.unsqueeze(1), outputs, outputs.new_zeros(()))
        return torch.zeros_like(hidden).index_add_(0, groups.tokens, outputs)

    def parameter_count(self) -> int:
        """Elements of this rank's expert weights (the padding aside)."""
        return self.num_weights


def fused_experts_on_cuda(
    hidden: torch.Tensor, routing: Routing, gate_up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """The experts through the fused Triton kernels, imported on first use so CPU installs need no Triton."""
    from tandem_server.layers.moe import triton_grouped  # noqa: PLC0415

    return triton_grouped.fused_experts(hidden, routing, gate_up, down)
