"""Widens a block-wise FP8 checkpoint's `weight_scale_inv` to the rows a rank holds: one scale per row and run of
`inputs` input features (`[rows, ceil(in / inputs)]`), which is what the GEMM takes.

Rows need not align with blocks: each row reads its block's scale, so a column-parallel rank or a fused tensor's
part may start anywhere. Input features must: a rank split along its inputs (row-parallel) starts on a block, and
ends on one or at the last input, else a run of its activations would straddle two blocks.

For the CUDA GEMM the widened scales go back, once at load, to what one `_scaled_mm` takes: 128 x 128 block scales
where the weight's rows and inputs fall on such blocks (`gemm_block_scales`), else one scale per row, the weight
rounded to float8 again (`requantize_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from tandem_server.quant.values import Fp8Channels, quantize_fp8
from tandem_server.weights.slicing import CheckpointSlice, CheckpointTensor

# torch's block-scaled float8 GEMM takes weight scales per 128 x 128 block and activation scales per 1 x 128 inputs.
GEMM_BLOCK = 128
# cuBLASLt reads block scales at a stride of a multiple of 4 blocks of inputs (16 bytes), which `_scaled_mm` cannot
# pad: it takes the inputs' block count as the stride, so only inputs in multiples of 4 blocks (512) are read right.
GEMM_BLOCK_ALIGNMENT = 4
# Rows requantized at a time: bounds the float32 copy a weight takes while it is rounded again.
_REQUANTIZE_ROWS = 1024


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


def gemm_block_scales(channels: Fp8Channels) -> torch.Tensor | None:
    """The float32 `[ceil(out / 128), in / 128]` block scales of a weight whose scales repeat over 128 x 128 blocks
    from its first row and input, as torch's block-scaled GEMM takes them; None for any other weight (other block
    sizes, rows starting inside a block, inputs not a multiple of `GEMM_BLOCK * GEMM_BLOCK_ALIGNMENT`)."""
    if channels.input_group != GEMM_BLOCK or channels.q.shape[1] % (GEMM_BLOCK * GEMM_BLOCK_ALIGNMENT):
        return None
    scale = channels.scale.float()
    blocks = scale[::GEMM_BLOCK]
    if not torch.equal(blocks.repeat_interleave(GEMM_BLOCK, dim=0)[: scale.shape[0]], scale):
        return None
    return blocks.contiguous()


def requantize_rows(channels: Fp8Channels) -> Fp8Channels:
    """The values of a block-wise weight rounded to float8 again with one scale per output row (what a row-wise GEMM
    takes): within half a float8 step of each value, or of a subnormal step of its row's scale."""
    slabs = [slice(start, start + _REQUANTIZE_ROWS) for start in range(0, channels.q.shape[0], _REQUANTIZE_ROWS)]
    parts = [
        quantize_fp8(replace(channels, q=channels.q[rows], scale=channels.scale[rows]).dequantize()) for rows in slabs
    ]
    q, scale = torch.cat([part.q for part in parts]), torch.cat([part.scale for part in parts])
    return Fp8Channels(q, scale, channels.input_scale, channels.activation_bound)
