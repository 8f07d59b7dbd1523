"""gpt-oss's routed experts with MXFP4 weights kept packed (`quant/mxfp4/format.py`), on the CPU.

The packed stacks are held as the checkpoint names them: `gate_up_proj_blocks [experts, 2 * I, hidden / 32, 16]` and
`gate_up_proj_scales [experts, 2 * I, hidden / 32]` (rows are the interleaved gate/up features),
`down_proj_blocks [experts, hidden, I / 32, 16]` and `down_proj_scales [experts, hidden, I / 32]`. A rank's run of
intermediate features is a run of gate/up rows and of whole down blocks, so ranks split the features in runs of 32.

Dispatch sorts the pairs by expert like the float experts, then multiplies each expert that received rows by its own
weights, dequantized for that one multiplication: experts no token chose are never unpacked, and at most one expert's
float weights exist at a time. Which experts received rows is read on the host (the CPU has no transfer to wait for),
inside an operator of Tandem's own that compiled steps call as one node of their graphs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tandem_server.errors import ConfigError
from tandem_server.layers.moe.routing import ExpertGroups
from tandem_server.layers.moe.swiglu_experts import ClampedSwiGLU, ClampedSwiGLUExperts, ExpertShape
from tandem_server.quant.mxfp4.format import BLOCK_BYTES, BLOCK_VALUES, dequantize, pair_values
from tandem_server.weights.slicing import CheckpointSlice, sliced_parameter


class Mxfp4SwiGLUExperts(ClampedSwiGLUExperts):
    """Every routed expert of one layer, its weights MXFP4 blocks and scales and its biases float."""

    def _register_weights(self, shape: ExpertShape) -> None:
        """The packed stacks, this rank's features of each."""
        run, hidden, experts = shape.features, shape.hidden_size, shape.num_experts
        if torch.get_default_device().type != "cpu":
            raise ConfigError("MXFP4 expert weights are served on the CPU only; give a bfloat16 checkpoint for a GPU")
        if hidden % BLOCK_VALUES or run.start % BLOCK_VALUES or run.stop % BLOCK_VALUES:
            raise ValueError(f"invariant: MXFP4 experts split along whole blocks of {BLOCK_VALUES} values")
        rows = CheckpointSlice.of(1, range(2 * run.start, 2 * run.stop))
        gate_up = (experts, 2 * len(run), hidden // BLOCK_VALUES)
        self.gate_up_proj_blocks = sliced_parameter((*gate_up, BLOCK_BYTES), rows, torch.uint8)
        self.gate_up_proj_scales = sliced_parameter(gate_up, rows, torch.uint8)
        blocks = CheckpointSlice.of(2, range(run.start // BLOCK_VALUES, run.stop // BLOCK_VALUES))
        down = (experts, hidden, len(run) // BLOCK_VALUES)
        self.down_proj_blocks = sliced_parameter((*down, BLOCK_BYTES), blocks, torch.uint8)
        self.down_proj_scales = sliced_parameter(down, blocks, torch.uint8)
        # The table that unpacks them in the model's dtype, one for every layer.
        self.pair_values = pair_values(torch.get_default_dtype())

    def project(self, rows: torch.Tensor, groups: ExpertGroups, sorted_experts: torch.Tensor) -> torch.Tensor:
        """Each row's expert output (its down bias included on rank 0), one chosen expert at a time."""
        weights = [
            self.gate_up_proj_blocks,
            self.gate_up_proj_scales,
            self.gate_up_proj_bias,
            self.down_proj_blocks,
            self.down_proj_scales,
            self.down_proj_bias,
        ]
        glu = self.glu
        return mxfp4_swiglu_experts(
            rows, groups.ends, weights, self.pair_values, glu.alpha, glu.limit, self.adds_down_bias
        )


# Tandem's own operator, opaque to torch.compile: a compiled step calls it as one node of its graph, instead of
# tracing a loop that depends on which experts received rows.
@torch.library.custom_op("tandem::mxfp4_swiglu_experts", mutates_args=())
def mxfp4_swiglu_experts(
    rows: torch.Tensor,
    ends: torch.Tensor,
    weights: list[torch.Tensor],
    values: torch.Tensor,
    alpha: float,
    limit: float,
    adds_down_bias: bool,
) -> torch.Tensor:
    """The outputs of `rows` sorted by expert (expert e's run ends at `ends[e]`), for `weights` the gate/up blocks,
    scales and bias then the down blocks, scales and bias of every expert."""
    gate_up_blocks, gate_up_scales, gate_up_bias, down_blocks, down_scales, down_bias = weights
    glu = ClampedSwiGLU(alpha, limit)
    outputs = rows.new_empty(rows.shape[0], down_bias.shape[1])
    start = 0
    for expert, end in enumerate(ends.tolist()):
        if end > start:
            gate_up = dequantize(gate_up_blocks[expert], gate_up_scales[expert], values)
            activated = glu(F.linear(rows[start:end], gate_up, gate_up_bias[expert]))
            down = dequantize(down_blocks[expert], down_scales[expert], values)
            outputs[start:end] = F.linear(activated, down, down_bias[expert] if adds_down_bias else None)
        start = end
    return outputs


@mxfp4_swiglu_experts.register_fake
def _(
    rows: torch.Tensor,
    ends: torch.Tensor,
    weights: list[torch.Tensor],
    values: torch.Tensor,
    alpha: float,
    limit: float,
    adds_down_bias: bool,
) -> torch.Tensor:
    return rows.new_empty(rows.shape[0], weights[-1].shape[1])
