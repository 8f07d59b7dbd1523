"""A Triton kernel for multi-head latent attention's (MLA's) absorbed decode over the paged latent cache; imported
only when the Triton backend is built.

Each decode row's query is already in latent space: per head, `q_nope` multiplied by its key expansion (the
`latent_dim` first features) then its rotated `q_rope` (the rest). Every head attends to the same cached rows, one
per token: the latent then the rotary key as the key, the latent alone as the value, so the output is a latent per
head and the value expansion stays in torch. One program handles one decode row and a tile of its heads: each key
tile is loaded once for up to `HEAD_TILE` heads, which is what makes the absorbed form cheap (multi-query attention
with one wide key head). An online softmax keeps the scores out of memory; rows with few programs split their keys
across programs and combine the parts with the paged-attention kernel's `_combine_splits`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tandem_server.layers.attention.metadata import PagedLayout
from tandem_server.layers.attention.triton_kernel import MIN_DOT_DIM, _combine_splits, pow2_at_least

# Query heads per program: tl.dot needs at least 16 rows, and 16 latents of 512 in float32 (the accumulator) take 64
# registers per thread of 4 warps.
HEAD_TILE = 16
# Each latent key tile stays within this many bytes: 32 bfloat16 or 16 float32 keys of a 512-wide latent, so two
# pipelined stages and the query fit the 99 KiB of sm86/sm89 as well as sm80's and sm90's larger shared memory
# (test_triton_latent_compile.py measures them).
KEY_TILE_BYTES = 32 * 1024
MAX_KEY_TILE = 64
NUM_WARPS = 4
NUM_STAGES = 2


@dataclass(frozen=True)
class LatentLaunch:
    """How one step's absorbed decode is laid out over programs; shared by every layer of the step."""

    # [decodes] int32 sequence of each decode row; None: decode row i is sequence i (a step of decodes only).
    seqs: torch.Tensor | None
    # Programs per (decode row, head tile), each over its share of the keys; 1: no split.
    num_splits: int = 1


def key_tile(latent_dim: int, dtype: torch.dtype) -> int:
    """Keys per tile: at most MAX_KEY_TILE, and at most KEY_TILE_BYTES of latents."""
    row_bytes = pow2_at_least(latent_dim) * torch.empty((), dtype=dtype).element_size()
    return max(MIN_DOT_DIM, min(MAX_KEY_TILE, KEY_TILE_BYTES // row_bytes))


def kernel_constants(latent_dim: int, rope_dim: int, num_heads: int, page: int, dtype: torch.dtype) -> dict[str, int]:
    """The compile-time constants of one launch (also what the ahead-of-time compile test sweeps)."""
    return {
        "NUM_HEADS": num_heads,
        "LATENT": latent_dim,
        "ROPE": rope_dim,
        "BLOCK_L": pow2_at_least(latent_dim),
        "BLOCK_R": pow2_at_least(rope_dim),
        "PAGE": page,
        "BLOCK_N": key_tile(latent_dim, dtype),
        "BLOCK_H": HEAD_TILE,
        "IEEE": dtype == torch.float32,
    }


@triton.jit
def _scores(q_latent, q_rope, k_latent, k_rope, IEEE: tl.constexpr):
    """[heads, keys] dot products of the latent parts plus those of the rotary parts."""
    if IEEE:
        scores = tl.dot(q_latent, tl.trans(k_latent), input_precision="ieee")
        scores += tl.dot(q_rope, tl.trans(k_rope), input_precision="ieee")
    else:
        scores = tl.dot(q_latent, tl.trans(k_latent))
        scores += tl.dot(q_rope, tl.trans(k_rope))
    return scores


@triton.jit
def _attend_keys(  # noqa: PLR0913, PLR0917  (device helper: arguments are registers)
    q_latent,
    q_rope,
    cache_ptr,
    table_row_ptr,
    key_lo,
    key_hi,
    scale,
    stride_cache_block,
    stride_cache_slot,
    LATENT: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_R: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    IEEE: tl.constexpr,
):
    """Online softmax over keys [key_lo, key_hi): returns (unnormalised latent output, running max, running sum)."""
    latent = tl.arange(0, BLOCK_L)
    latent_valid = latent < LATENT
    rope = tl.arange(0, BLOCK_R)
    rope_valid = rope < ROPE
    running_max = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_L], dtype=tl.float32)
    for start in range(key_lo, key_hi, BLOCK_N):
        position = start + tl.arange(0, BLOCK_N)
        key_valid = position < key_hi
        block = tl.load(table_row_ptr + position // PAGE, mask=key_valid, other=0).to(tl.int64)
        # Cache rows [blocks, PAGE, 1, LATENT + ROPE]: the latent then the rotary key.
        key_row = block * stride_cache_block + (position % PAGE) * stride_cache_slot
        k_latent = tl.load(
            cache_ptr + key_row[:, None] + latent[None, :], mask=key_valid[:, None] & latent_valid[None, :], other=0.0
        )
        k_rope = tl.load(
            cache_ptr + key_row[:, None] + LATENT + rope[None, :],
            mask=key_valid[:, None] & rope_valid[None, :],
            other=0.0,
        )
        scores = _scores(q_latent, q_rope, k_latent, k_rope, IEEE).to(tl.float32) * scale
        scores = tl.where(key_valid[None, :], scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, 1))
        # A split's first tile always holds a key, so new_max is finite; the guard keeps exp() from NaN regardless.
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        probs = tl.exp(scores - safe_max[:, None])
        correction = tl.exp(running_max - safe_max)
        running_sum = running_sum * correction + tl.sum(probs, 1)
        if IEEE:
            update = tl.dot(probs.to(k_latent.dtype), k_latent, input_precision="ieee")
        else:
            update = tl.dot(probs.to(k_latent.dtype), k_latent)
        acc = acc * correction[:, None] + update.to(tl.float32)
        running_max = new_max
    return acc, running_max, running_sum


@triton.jit(do_not_specialize=["stride_table", "num_splits"])
def _latent_decode(  # noqa: PLR0913, PLR0917  (a kernel's signature is its launch contract)
    out_ptr,
    partial_ptr,
    lse_ptr,
    q_ptr,
    cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    seqs_ptr,
    scale,
    num_splits,
    stride_q_row,
    stride_q_head,
    stride_cache_block,
    stride_cache_slot,
    stride_table,
    NUM_HEADS: tl.constexpr,
    LATENT: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_R: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    GATHER: tl.constexpr,
    SPLIT: tl.constexpr,
    IEEE: tl.constexpr,
):
    row = tl.program_id(0)
    head_tile = tl.program_id(1)
    split = tl.program_id(2)
    seq = row
    if GATHER:
        seq = tl.load(seqs_ptr + row)
    seq_len = tl.load(seq_lens_ptr + seq)
    heads = head_tile * BLOCK_H + tl.arange(0, BLOCK_H)
    head_valid = heads < NUM_HEADS
    latent = tl.arange(0, BLOCK_L)
    latent_valid = latent < LATENT
    rope = tl.arange(0, BLOCK_R)
    rope_valid = rope < ROPE
    # Queries [rows, heads, LATENT + ROPE]: the latent-space query then the rotated rotary query.
    q_rows = row * stride_q_row + heads * stride_q_head
    q_latent = tl.load(
        q_ptr + q_rows[:, None] + latent[None, :], mask=head_valid[:, None] & latent_valid[None, :], other=0.0
    )
    q_rope = tl.load(
        q_ptr + q_rows[:, None] + LATENT + rope[None, :], mask=head_valid[:, None] & rope_valid[None, :], other=0.0
    )

    key_lo = 0
    key_hi = seq_len
    if SPLIT:
        chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
        key_lo = split * chunk
        key_hi = tl.minimum(key_lo + chunk, seq_len)
    acc, running_max, running_sum = _attend_keys(
        q_latent, q_rope, cache_ptr, block_tables_ptr + seq * stride_table, key_lo, key_hi, scale,
        stride_cache_block, stride_cache_slot, LATENT, ROPE, BLOCK_L, BLOCK_R, PAGE, BLOCK_N, BLOCK_H, IEEE,
    )  # fmt: skip
    out = acc / tl.where(running_sum == 0.0, 1.0, running_sum)[:, None]
    # Outputs [rows, NUM_HEADS, LATENT]; partial results [split, rows * NUM_HEADS, LATENT] with their log-sum-exp.
    out_row = row * NUM_HEADS + heads
    io_mask = head_valid[:, None] & latent_valid[None, :]
    if SPLIT:
        partial_row = split * tl.num_programs(0) * NUM_HEADS + out_row
        tl.store(partial_ptr + partial_row[:, None] * LATENT + latent[None, :], out, mask=io_mask)
        has_keys = running_sum > 0.0
        lse = tl.where(has_keys, running_max + tl.log(tl.where(has_keys, running_sum, 1.0)), float("-inf"))
        tl.store(lse_ptr + partial_row, lse, mask=head_valid)
    else:
        tl.store(out_ptr + out_row[:, None] * LATENT + latent[None, :], out.to(out_ptr.dtype.element_ty), mask=io_mask)


def latent_decode(
    query: torch.Tensor,
    cache_rows: torch.Tensor,
    paged: PagedLayout,
    latent_dim: int,
    scale: float,
    launch: LatentLaunch,
) -> torch.Tensor:
    """`query` [decodes, heads, latent_dim + rope_dim] against the paged rows [blocks, block_size, 1, latent_dim +
    rope_dim] of `paged`'s sequences -> the attended latent [decodes, heads, latent_dim]."""
    num_rows, num_heads, width = query.shape
    _, page, _, _ = cache_rows.shape
    output = query.new_empty(num_rows, num_heads, latent_dim)
    split = launch.num_splits > 1
    partial = lse = output
    if split:
        partial = torch.empty(
            launch.num_splits, num_rows, num_heads, latent_dim, dtype=torch.float32, device=query.device
        )
        lse = torch.empty(launch.num_splits, num_rows, num_heads, dtype=torch.float32, device=query.device)
    constants = kernel_constants(latent_dim, width - latent_dim, num_heads, page, query.dtype)
    grid = (num_rows, triton.cdiv(num_heads, HEAD_TILE), launch.num_splits)
    _latent_decode[grid](
        output, partial, lse, query, cache_rows, paged.block_tables, paged.seq_lens,
        launch.seqs if launch.seqs is not None else paged.seq_lens, scale, launch.num_splits,
        query.stride(0), query.stride(1), cache_rows.stride(0), cache_rows.stride(1), paged.block_tables.stride(0),
        GATHER=launch.seqs is not None, SPLIT=split, num_warps=NUM_WARPS, num_stages=NUM_STAGES, **constants,
    )  # fmt: skip
    if split:
        rows = num_rows * num_heads
        _combine_splits[(rows,)](
            output, partial, lse, launch.num_splits, rows,
            HEAD_DIM=latent_dim, BLOCK_D=pow2_at_least(latent_dim), BLOCK_S=pow2_at_least(launch.num_splits, 2),
        )  # fmt: skip
    return output
