"""The LoRA deltas of a step's adapter rows on CUDA as two segmented Triton GEMMs (SGMV) for steps with many adapter
rows (prompt chunks); imported only when adapters run on a CUDA device (or under Triton's interpreter in tests).

The adapter rows are sorted by slot into segments, and each segment cut into blocks of ROW_BLOCK rows
(`slots.RowBlocks`): `shrink` multiplies a block's rows of `x` by its slot's `a [slots, rank, in]` with `tl.dot` into
float32 `[sorted rows, rank]`; `expand` multiplies that by the slot's `b [slots, out, rank]` and adds it to the
rows of `out` in place. Float32 models get IEEE float32 dots (never TF32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tandem_server.lora.slots import ROW_BLOCK, RowBlocks

BLOCK_RANK = 16
BLOCK_IN = 64
BLOCK_OUT = 64


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _shrink(  # noqa: PLR0913, PLR0917  (kernel: arguments are registers)
    x_ptr,
    a_ptr,
    rows_ptr,
    block_slots_ptr,
    block_starts_ptr,
    block_ends_ptr,
    shrunk_ptr,
    in_features,
    rank,
    stride_x,
    stride_a_slot,
    stride_a_rank,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE: tl.constexpr,
):
    block = tl.program_id(0)
    slot = tl.load(block_slots_ptr + block)
    positions = tl.load(block_starts_ptr + block) + tl.arange(0, BLOCK_M)
    valid = positions < tl.load(block_ends_ptr + block)
    rows = tl.load(rows_ptr + positions, mask=valid, other=0)
    ranks = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for start in range(0, in_features, BLOCK_K):
        inputs = start + tl.arange(0, BLOCK_K)
        x_mask = valid[:, None] & (inputs[None, :] < in_features)
        x = tl.load(x_ptr + rows[:, None] * stride_x + inputs[None, :], mask=x_mask, other=0.0)
        a_offsets = slot * stride_a_slot + ranks[None, :] * stride_a_rank + inputs[:, None]
        a_mask = (ranks[None, :] < rank) & (inputs[:, None] < in_features)
        a = tl.load(a_ptr + a_offsets, mask=a_mask, other=0.0)
        acc = _dot(x, a.to(x.dtype), acc, IEEE)
    offsets = positions[:, None] * rank + ranks[None, :]
    tl.store(shrunk_ptr + offsets, acc, mask=valid[:, None] & (ranks[None, :] < rank))


@triton.jit
def _expand(  # noqa: PLR0913, PLR0917  (kernel: arguments are registers)
    shrunk_ptr,
    b_ptr,
    rows_ptr,
    block_slots_ptr,
    block_starts_ptr,
    block_ends_ptr,
    out_ptr,
    out_features,
    rank,
    stride_out,
    stride_b_slot,
    stride_b_out,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    IEEE: tl.constexpr,
):
    block = tl.program_id(0)
    slot = tl.load(block_slots_ptr + block)
    positions = tl.load(block_starts_ptr + block) + tl.arange(0, BLOCK_M)
    valid = positions < tl.load(block_ends_ptr + block)
    rows = tl.load(rows_ptr + positions, mask=valid, other=0)
    outputs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, rank, BLOCK_R):
        ranks = start + tl.arange(0, BLOCK_R)
        s_mask = valid[:, None] & (ranks[None, :] < rank)
        shrunk = tl.load(shrunk_ptr + positions[:, None] * rank + ranks[None, :], mask=s_mask, other=0.0)
        b_offsets = slot * stride_b_slot + outputs[None, :] * stride_b_out + ranks[:, None]
        b_mask = (outputs[None, :] < out_features) & (ranks[:, None] < rank)
        b = tl.load(b_ptr + b_offsets, mask=b_mask, other=0.0)
        acc = _dot(shrunk.to(b.dtype), b, acc, IEEE)
    out_mask = valid[:, None] & (outputs[None, :] < out_features)
    out_offsets = rows[:, None] * stride_out + outputs[None, :]
    previous = tl.load(out_ptr + out_offsets, mask=out_mask, other=0.0)
    tl.store(out_ptr + out_offsets, (previous.to(tl.float32) + acc).to(previous.dtype), mask=out_mask)


def add_segmented_deltas(
    out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, blocks: RowBlocks
) -> torch.Tensor:
    """`out` with each adapter row's `(x[row] @ a[slot].T) @ b[slot].T` added, in place."""
    num_blocks = blocks.block_slots.shape[0]
    if num_blocks == 0:
        return out
    if not a.is_contiguous() or not b.is_contiguous():
        raise ValueError("invariant: the slot stacks are contiguous")
    # The kernels step through a row's features one by one.
    x = x if x.stride(1) == 1 else x.contiguous()
    out = out if out.stride(1) == 1 else out.contiguous()
    rank, in_features, out_features = a.shape[1], a.shape[2], b.shape[1]
    ieee = x.dtype == torch.float32
    shrunk = torch.empty(blocks.rows.shape[0], rank, dtype=torch.float32, device=x.device)
    _shrink[(num_blocks, triton.cdiv(rank, BLOCK_RANK))](
        x, a, blocks.rows, blocks.block_slots, blocks.block_starts, blocks.block_ends, shrunk,
        in_features, rank, x.stride(0), a.stride(0), a.stride(1), ROW_BLOCK, BLOCK_RANK, BLOCK_IN, ieee,
    )  # fmt: skip
    _expand[(num_blocks, triton.cdiv(out_features, BLOCK_OUT))](
        shrunk, b, blocks.rows, blocks.block_slots, blocks.block_starts, blocks.block_ends, out,
        out_features, rank, out.stride(0), b.stride(0), b.stride(1), ROW_BLOCK, BLOCK_OUT, BLOCK_RANK, ieee,
    )  # fmt: skip
    return out
