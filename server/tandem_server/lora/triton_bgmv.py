"""The LoRA deltas of a step's adapter rows on CUDA as two Triton kernels over the adapters' device slots (BGMV:
each row gathers its own slot's weights); imported only when adapters run on a CUDA device (or under Triton's
interpreter in tests).

`shrink` multiplies each adapter row of `x` by its slot's `a [slots, rank, in]` into float32 `[rows, rank]`;
`expand` multiplies that by the slot's `b [slots, out, rank]` and adds it to the row of `out` in place. Only the
rows under an adapter are launched: base rows are never read or written. Products accumulate in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_RANK = 16
BLOCK_IN = 64
BLOCK_OUT = 64


@triton.jit
def _shrink(  # noqa: PLR0913, PLR0917  (kernel: arguments are registers)
    x_ptr,
    a_ptr,
    rows_ptr,
    slots_ptr,
    shrunk_ptr,
    in_features,
    rank,
    stride_x,
    stride_a_slot,
    stride_a_rank,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    index = tl.program_id(0)
    row = tl.load(rows_ptr + index).to(tl.int64)
    slot = tl.load(slots_ptr + index).to(tl.int64)
    ranks = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for start in range(0, in_features, BLOCK_K):
        inputs = start + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + row * stride_x + inputs, mask=inputs < in_features, other=0.0).to(tl.float32)
        a_offsets = slot * stride_a_slot + ranks[:, None] * stride_a_rank + inputs[None, :]
        a_mask = (ranks[:, None] < rank) & (inputs[None, :] < in_features)
        a = tl.load(a_ptr + a_offsets, mask=a_mask, other=0.0).to(tl.float32)
        acc += tl.sum(a * x[None, :], axis=1)
    tl.store(shrunk_ptr + index * rank + ranks, acc, mask=ranks < rank)


@triton.jit
def _expand(  # noqa: PLR0913, PLR0917  (kernel: arguments are registers)
    shrunk_ptr,
    b_ptr,
    rows_ptr,
    slots_ptr,
    out_ptr,
    out_features,
    rank,
    stride_out,
    stride_b_slot,
    stride_b_out,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    index = tl.program_id(0)
    row = tl.load(rows_ptr + index).to(tl.int64)
    slot = tl.load(slots_ptr + index).to(tl.int64)
    outputs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, rank, BLOCK_R):
        ranks = start + tl.arange(0, BLOCK_R)
        shrunk = tl.load(shrunk_ptr + index * rank + ranks, mask=ranks < rank, other=0.0)
        b_offsets = slot * stride_b_slot + outputs[:, None] * stride_b_out + ranks[None, :]
        b_mask = (outputs[:, None] < out_features) & (ranks[None, :] < rank)
        b = tl.load(b_ptr + b_offsets, mask=b_mask, other=0.0).to(tl.float32)
        acc += tl.sum(b * shrunk[None, :], axis=1)
    out_offsets = row * stride_out + outputs
    previous = tl.load(out_ptr + out_offsets, mask=outputs < out_features, other=0.0)
    tl.store(out_ptr + out_offsets, (previous.to(tl.float32) + acc).to(previous.dtype), mask=outputs < out_features)


def add_slotted_deltas(
    out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor
) -> torch.Tensor:
    """`out` with `(x[rows[i]] @ a[slots[i]].T) @ b[slots[i]].T` added to row `rows[i]`, in place; `rows` holds each
    adapter row once."""
    if rows.numel() == 0:
        return out
    if not a.is_contiguous() or not b.is_contiguous():
        raise ValueError("invariant: the slot stacks are contiguous")
    # The kernels step through a row's features one by one.
    x = x if x.stride(1) == 1 else x.contiguous()
    out = out if out.stride(1) == 1 else out.contiguous()
    num_rows = rows.shape[0]
    rank, in_features = a.shape[1], a.shape[2]
    out_features = b.shape[1]
    shrunk = torch.empty(num_rows, rank, dtype=torch.float32, device=x.device)
    _shrink[(num_rows, triton.cdiv(rank, BLOCK_RANK))](
        x, a, rows, slots, shrunk, in_features, rank, x.stride(0), a.stride(0), a.stride(1), BLOCK_RANK, BLOCK_IN
    )
    _expand[(num_rows, triton.cdiv(out_features, BLOCK_OUT))](
        shrunk, b, rows, slots, out, out_features, rank, out.stride(0), b.stride(0), b.stride(1), BLOCK_OUT, BLOCK_RANK
    )
    return out
