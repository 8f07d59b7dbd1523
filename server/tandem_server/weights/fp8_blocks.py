"""Widens a block-wise FP8 checkpoint's `weight_scale_inv` to the rows a rank holds: one scale per row and run of
`inputs` input features (`[rows, ceil(in / inputs)]`), which is what the GEMM takes.

Rows need not align with blocks: each row reads its block's scale, so a column-parallel rank or a fused tensor's
part may start anywhere. Input features must: a rank split along its inputs (row-parallel) starts on a block, and
ends on one or at the last input, else a run of its activations would straddle two blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tandem_server.weights.slicing import CheckpointSlice, CheckpointTensor


@dataclass(frozen=True)
class BlockWindow:
    """Which rows and input features of its checkpoint layer's weight a parameter holds."""

    rows: range
    inputs: range


def block_window(param: nn.Parameter, offset: int) -> BlockWindow:
    """The part of its checkpoint layer `param` holds: rows `offset` on of a fused tensor, and its rank's slice."""
    out_features, in_features = param.shape
    part: CheckpointSlice | None = getattr(param, "checkpoint_slice", None)
    if part is not None and part.dim == 0:
        return BlockWindow(range(offset + part.start, offset + part.stop), range(in_features))
    if part is not None:
        return BlockWindow(range(offset, offset + out_features), range(part.start, part.stop))
    return BlockWindow(range(offset, offset + out_features), range(in_features))


def row_scales(tensor: CheckpointTensor, window: BlockWindow, block: tuple[int, int]) -> torch.Tensor:
    """The float32 scales `[rows, runs]` of `window`, read from the block scales `tensor`."""
    block_rows, block_inputs = block
    if len(tensor.shape) != 2:
        raise ValueError(f"has shape {tuple(tensor.shape)}; block scales are 2-D [row blocks, input blocks]")
    inputs = window.inputs
    first_run, end_run = inputs.start // block_inputs, -(-inputs.stop // block_inputs)
    ends_on_block = inputs.stop % block_inputs == 0 or end_run == tensor.shape[1]
    if inputs.start % block_inputs or not ends_on_block:
        raise ValueError(
            f"this rank's input features [{inputs.start}, {inputs.stop}) do not cover whole blocks of "
            f"{block_inputs} (weight_block_size {list(block)}): give a tensor-parallel size that splits the "
            "inputs on blocks"
        )
    first_block, end_block = window.rows.start // block_rows, -(-window.rows.stop // block_rows)
    if end_block > tensor.shape[0] or end_run > tensor.shape[1]:
        raise ValueError(
            f"has shape {tuple(tensor.shape)}; rows [{window.rows.start}, {window.rows.stop}) and input features "
            f"[{inputs.start}, {inputs.stop}) in blocks of {list(block)} need at least "
            f"({end_block}, {end_run})"
        )
    blocks = tensor.read(CheckpointSlice.of(0, range(first_block, end_block)))[:, first_run:end_run]
    within = window.rows.start - first_block * block_rows
    return blocks.float().repeat_interleave(block_rows, dim=0)[within : within + len(window.rows)].contiguous()


def check_block_count(tensor: CheckpointTensor, rows: int, inputs: int, block: tuple[int, int]) -> None:
    """Raises unless `tensor` holds exactly the blocks of a whole `rows` x `inputs` weight."""
    expected = (-(-rows // block[0]), -(-inputs // block[1]))
    if tuple(tensor.shape) != expected:
        raise ValueError(
            f"has shape {tuple(tensor.shape)}; a {rows} x {inputs} weight in blocks of {list(block)} needs {expected}"
        )
