"""Tandem's int4 weight-only GEMM for CUDA (w4a16) in Triton: `y = x @ W.T`, each tile of W dequantized in
registers from its 4-bit values; imported only when an int4 weight lives on a CUDA device.

Layout (`pack`): the values `q` `[out, in]` (0..15) are packed eight to an int32 along the input features and stored
`[in / 8, out]`: bits 4i to 4i + 3 of word `[j, n]` hold `q[n, 8 j + i]` (GPTQ's `qweight` layout), so a tile's words
are contiguous along the outputs. Scales and zeros are `[in / group, out]` in the activation dtype (bfloat16 or
float16). Each weight is `(q - 8) * scale + zero`, computed in float32 and rounded to the activation dtype for the dot;
products accumulate in float32.

Small batches (decodes) have too few output tiles to occupy the GPU, so their input features are split across
programs (split-K); the float32 partial sums are added afterwards.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tandem_server.quant.values import INT4_KERNEL_GROUPS, INT4_MIDPOINT

NIBBLES = 8
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)
# Split-K aims for this many programs per streaming multiprocessor, each over at least `MIN_SPLIT_TILES` tiles of
# input features, in at most `MAX_SPLITS` parts.
PROGRAMS_PER_SM = 2
MIN_SPLIT_TILES = 4
MAX_SPLITS = 16
# H100/H200; the interpreter (CPU tensors) plans as if on one.
DEFAULT_SM_COUNT = 132
# tl.dot needs every tile dimension to be at least 16: one decode row is padded to 16.
DECODE_ROWS = 16


@dataclass(frozen=True)
class TileConfig:
    """A launch's tile sizes; `block_k` divides the group size, so every tile of inputs lies in one group."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def tile_config(rows: int, group_size: int) -> TileConfig:
    """Tiles for `rows` activation rows: a 16-row tile for decodes, 64 rows for prefill chunks. Not yet timed on a
    GPU; each compiles within sm80's shared memory (`test_int4_triton.py`)."""
    if rows <= DECODE_ROWS:
        return TileConfig(DECODE_ROWS, 64, min(group_size, 128), num_warps=4, num_stages=4)
    return TileConfig(64, 128, min(group_size, 64), num_warps=4, num_stages=3)


def k_splits(output_tiles: int, k_tiles: int, sm_count: int) -> int:
    """Parts to split the input features into so that small batches still fill the GPU."""
    wanted = -(-PROGRAMS_PER_SM * sm_count // output_tiles)
    return max(1, min(wanted, MAX_SPLITS, k_tiles // MIN_SPLIT_TILES))


def pack(q: torch.Tensor) -> torch.Tensor:
    """int4 values `[out, in]` (0..15) as the kernel's int32 words `[in / 8, out]`, one nibble at a time (at load on
    the GPU, so no wider copy of the whole weight is made)."""
    out_features, in_features = q.shape
    if in_features % NIBBLES:
        raise ValueError(f"int4 packing needs input features in multiples of {NIBBLES}, this weight has {in_features}")
    columns = q.t()
    words = torch.zeros(in_features // NIBBLES, out_features, dtype=torch.int32, device=q.device)
    for nibble in range(NIBBLES - 1):
        words |= columns[nibble::NIBBLES].to(torch.int32) << (4 * nibble)
    top = columns[NIBBLES - 1 :: NIBBLES].to(torch.int32)
    # Bit 31 is the sign bit: the top nibble goes in as a signed 4-bit value times 2^28, which int32 holds exactly.
    words += (top - 16 * (top >> 3)) * 2**28
    return words


@triton.jit(do_not_specialize=["rows", "tiles_per_split"])
def _int4_gemm(  # noqa: PLR0913, PLR0917  (kernel: arguments are registers)
    x_ptr,
    words_ptr,
    scale_ptr,
    zero_ptr,
    out_ptr,
    rows,
    out_features,
    in_features,
    tiles_per_split,
    GROUP: tl.constexpr,
    MIDPOINT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One `[BLOCK_M, BLOCK_N]` output tile over one split's run of input tiles; `out_ptr` is the output itself
    (one split) or float32 partial sums `[splits, rows, out]`. x is `[rows, in]` and the output row-major."""
    tile_n = tl.program_id(0)
    tile_m = tl.program_id(1)
    split = tl.program_id(2)
    row = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    col = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = row < rows
    col_mask = col < out_features
    inputs = tl.arange(0, BLOCK_K)
    word_rows = tl.arange(0, BLOCK_K // 8)
    shifts = tl.arange(0, 8) * 4
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    first = split * tiles_per_split
    last = tl.minimum(first + tiles_per_split, in_features // BLOCK_K)
    for tile in range(first, last):
        start = tile * BLOCK_K
        x = tl.load(x_ptr + row[:, None] * in_features + (start + inputs)[None, :], mask=row_mask[:, None], other=0.0)
        word_offsets = (start // 8 + word_rows)[:, None] * out_features + col[None, :]
        words = tl.load(words_ptr + word_offsets, mask=col_mask[None, :], other=0)
        q = tl.reshape((words[:, None, :] >> shifts[None, :, None]) & 0xF, (BLOCK_K, BLOCK_N))
        group_offsets = (start // GROUP) * out_features + col
        scale = tl.load(scale_ptr + group_offsets, mask=col_mask, other=0.0).to(tl.float32)
        zero = tl.load(zero_ptr + group_offsets, mask=col_mask, other=0.0).to(tl.float32)
        weight = (q - MIDPOINT).to(tl.float32) * scale[None, :] + zero[None, :]
        acc = tl.dot(x, weight.to(x.dtype), acc)
    # int64: a long prefill chunk's rows times a wide layer's outputs can pass 2^31.
    offsets = (split * rows + row[:, None]).to(tl.int64) * out_features + col[None, :]
    tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


def int4_gemm(
    x: torch.Tensor, words: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int
) -> torch.Tensor:
    """`x @ W.T` for `x` `[rows, in]` in bfloat16 or float16 and W given by `pack`ed `words` `[in / 8, out]`, `scale`
    and `zero` `[in / group_size, out]` in x's dtype; the result in x's dtype."""
    rows, in_features = x.shape
    out_features = words.shape[1]
    _check(x, words, scale, zero, group_size)
    config = tile_config(rows, group_size)
    output_tiles = triton.cdiv(rows, config.block_m) * triton.cdiv(out_features, config.block_n)
    k_tiles = in_features // config.block_k
    splits = k_splits(output_tiles, k_tiles, _streaming_multiprocessors(x.device))
    tiles_per_split = triton.cdiv(k_tiles, splits)
    splits = triton.cdiv(k_tiles, tiles_per_split)
    if splits == 1:
        out = x.new_empty(rows, out_features)
    else:
        out = x.new_empty(splits, rows, out_features, dtype=torch.float32)
    grid = (triton.cdiv(out_features, config.block_n), triton.cdiv(rows, config.block_m), splits)
    _int4_gemm[grid](
        x.contiguous(), words, scale, zero, out, rows, out_features, in_features, tiles_per_split,
        GROUP=group_size, MIDPOINT=INT4_MIDPOINT, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return out if splits == 1 else out.sum(0).to(x.dtype)


def _check(x: torch.Tensor, words: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int) -> None:
    """Refuses what the kernel cannot multiply, rather than reading out of bounds."""
    if x.dtype not in ACTIVATION_DTYPES or scale.dtype != x.dtype or zero.dtype != x.dtype:
        raise ValueError(
            f"the int4 Triton kernel takes bfloat16 or float16 activations with scales and zeros of the same dtype, "
            f"not {x.dtype} activations with {scale.dtype} scales and {zero.dtype} zeros"
        )
    if group_size not in INT4_KERNEL_GROUPS:
        raise ValueError(f"the int4 Triton kernel takes groups of {INT4_KERNEL_GROUPS} inputs, not {group_size}")
    in_features = x.shape[1]
    groups = in_features // group_size
    expected = {"words": (in_features // NIBBLES, words.shape[1]), "scale": (groups, words.shape[1])}
    expected["zero"] = expected["scale"]
    actual = {"words": words.shape, "scale": scale.shape, "zero": zero.shape}
    if (
        in_features % group_size
        or words.dtype != torch.int32
        or any(tuple(actual[name]) != shape for name, shape in expected.items())
    ):
        raise ValueError(
            f"int4 GEMM of {in_features} input features in groups of {group_size} needs int32 words "
            f"{expected['words']} and scales and zeros {expected['scale']}; got {words.dtype} words "
            f"{tuple(words.shape)}, scales {tuple(scale.shape)}, zeros {tuple(zero.shape)}"
        )
    if not (words.is_contiguous() and scale.is_contiguous() and zero.is_contiguous()):
        raise ValueError("the int4 Triton kernel reads its words, scales and zeros as contiguous tensors")


@functools.cache
def _streaming_multiprocessors(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_SM_COUNT
