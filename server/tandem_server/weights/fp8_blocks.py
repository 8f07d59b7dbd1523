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
    """Which rows and input features of its checkpoint layer's weight a parameter holds, and whether it holds them
    all along each dimension (a rank's slice is along one of them)."""

    rows: range
    inputs: range
    whole_rows: bool = True
    whole_inputs: bool = True


def block_window(param: nn.Parameter, offset: int) -> BlockWindow:
    """The part of its checkpoint layer `param` holds: rows `offset` on of a fused tensor, and its rank's slice."""
    out_features, in_features = param.shape
    part: CheckpointSlice | None = getattr(param, "checkpoint_slice", None)
    if part is not None and part.dim == 0:
        return BlockWindow(range(offset + part.start, offset + part.stop), range(in_features), whole_rows=False)
    if part is not None:
        return BlockWindow(range(offset, offset + out_features), range(part.start, part.stop), whole_inputs=False)
    return BlockWindow(range(offset, offset + out_features), range(in_features))


def row_scales(tensor: CheckpointTensor, window: BlockWindow, block: tuple[int, int]) -> torch.Tensor:
    """The float32 scales `[rows, runs]` of `window`, read from the block scales `tensor`."""
    block_rows, block_inputs = block
    inputs = window.inputs
    first_run, end_run = inputs.start // block_inputs, -(-inputs.stop // block_inputs)
    first_block, end_block = window.rows.start // block_rows, -(-window.rows.stop // block_rows)
    if end_block > tensor.shape[0] or end_run > tensor.shape[1]:
        raise ValueError(
            f"has shape {tuple(tensor.shape)}; rows [{window.rows.start}, {window.rows.stop}) and input features "
            f"[{inputs.start}, {inputs.stop}) in blocks of {list(block)} need at least ({end_block}, {end_run})"
        )
    ends_on_block = inputs.stop % block_inputs == 0 or end_run == tensor.shape[1]
    if inputs.start % block_inputs or not ends_on_block:
        raise ValueError(
            f"this rank's input features [{inputs.start}, {inputs.stop}) do not cover whole blocks of "
            f"{block_inputs} (weight_block_size {list(block)}): give a tensor-parallel size that splits the "
            "inputs on blocks"
        )
    blocks = tensor.read(CheckpointSlice.of(0, range(first_block, end_block)))[:, first_run:end_run]
    within = window.rows.start - first_block * block_rows
    return blocks.float().repeat_interleave(block_rows, dim=0)[within : within + len(window.rows)].contiguous()


def check_block_count(tensor: CheckpointTensor, window: BlockWindow, block: tuple[int, int]) -> None:
    """Raises unless `tensor` holds as many blocks as the weight makes along each dimension `window` holds whole
    (`window` being the last part of a fused tensor, its rows end where the tensor's do); checked before
    `row_scales` reads it."""
    if len(tensor.shape) != 2:
        raise ValueError(f"has shape {tuple(tensor.shape)}; block scales are 2-D [row blocks, input blocks]")
    dimensions = (
        (0, window.whole_rows, window.rows.stop, "rows"),
        (1, window.whole_inputs, window.inputs.stop, "input features"),
    )
    for dim, whole, size, what in dimensions:
        expected = -(-size // block[dim])
        if whole and tensor.shape[dim] != expected:
            raise ValueError(
                f"has shape {tuple(tensor.shape)}; {size} {what} in blocks of {block[dim]} (weight_block_size "
                f"{list(block)}) make {expected}, not {tensor.shape[dim]}"
            )
