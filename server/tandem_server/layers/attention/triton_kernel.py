"""A paged-attention Triton kernel for mixed prefill/decode steps; imported only when the Triton backend is built.

One program handles one work item (a sequence and one tile of its query tokens) for one KV head; the query heads
sharing that KV head are stacked into the tile's rows, so each key tile is loaded once for the whole group
(grouped-query attention). Keys are visited in tiles of at most 64 positions whatever the page size: every key
row finds its own page through the block table, so a tile may span several small pages or part of a large one.
An online softmax keeps the score matrix out of memory. Decode-only steps with few sequences split each
sequence's keys across programs (flash-decoding) and combine the partial results in a second kernel. A head's
attention sink (gpt-oss) enters the online softmax as one more key of zero value, in the first split only. Tile sizes
and launch options depend on the GPU's shared memory (`tile_config`); the ahead-of-time compile test builds the
same configurations for every supported architecture.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tandem_server.errors import ConfigError
from tandem_server.interfaces.attention_registry import TRITON_MAX_HEAD_SIZE
from tandem_server.layers.attention.backend import AttentionParams
from tandem_server.layers.attention.metadata import PagedLayout

# Rows of a prefill tile (query tokens x grouped heads) and keys per K/V tile, at most, whatever the page size.
KEY_TILE = 64
# Each of the query, key and value tiles stays within this many bytes, so the kernel and its pipelined loads fit
# the shared memory of sm80 (163 KiB per block) at every head size and dtype; float32 at head size 256 halves both.
TILE_BYTES = 32 * 1024
# Compute capabilities whose blocks may opt into 163 KiB (sm80) or 227 KiB (sm90, sm100) of shared memory. Every
# other GPU gets tiles that fit 99 KiB (sm86, sm89), the least of any GPU from sm80 on: there float32 key and value
# tiles hold half of TILE_BYTES (full ones need 115,200 bytes at head size 128; bfloat16 ones fit as they are).
LARGE_SHARED_MEMORY = frozenset({(8, 0), (9, 0), (10, 0)})
# Triton's own defaults on CUDA, passed explicitly so the compile test builds exactly what is launched.
NUM_WARPS = 4
NUM_STAGES = 3
# The largest head size compiled and checked within shared memory on every supported GPU (test_triton_compile.py);
# start-up selection passes over the kernel above it.
MAX_HEAD_DIM = TRITON_MAX_HEAD_SIZE
# tl.dot needs every tile dimension to be at least 16.
MIN_DOT_DIM = 16


@dataclass(frozen=True)
class TileConfig:
    """The tiles and launch options of one (GPU, dtype, head size): the same for every step of a model."""

    # Rows of a prefill query tile (query tokens x grouped heads), at most.
    query_rows: int
    # Keys per K/V tile.
    key_rows: int
    num_warps: int = NUM_WARPS
    num_stages: int = NUM_STAGES


@dataclass(frozen=True)
class LaunchPlan:
    """How one step's attention is laid out over programs; shared by every layer of the step."""

    # Mixed steps: [items, 2] int32 (sequence, query tile) per program, so no program is empty; None: uniform steps,
    # where item i is tile i % tiles_per_seq of sequence i // tiles_per_seq.
    work: torch.Tensor | None
    num_items: int
    tile_tokens: int
    tiles: TileConfig
    tiles_per_seq: int = 1
    # Decode-only steps: programs per (sequence, KV head), each over its share of the keys; 1: no split.
    num_splits: int = 1


@triton.jit
def _attend_rows(  # noqa: PLR0913, PLR0917  (device helper: arguments are registers)
    q,
    k_cache_ptr,
    v_cache_ptr,
    table_row_ptr,
    kv_head,
    query_position,
    key_lo,
    key_hi,
    scale,
    softcap,
    window,
    stride_cache_block,
    stride_cache_slot,
    stride_cache_head,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    IEEE: tl.constexpr,
):
    """Online softmax over keys [key_lo, key_hi): returns (unnormalised output, running max, running sum)."""
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM
    running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start in range(key_lo, key_hi, BLOCK_N):
        key_position = start + tl.arange(0, BLOCK_N)
        key_valid = key_position < key_hi
        block = tl.load(table_row_ptr + key_position // PAGE, mask=key_valid, other=0).to(tl.int64)
        row = block * stride_cache_block + (key_position % PAGE) * stride_cache_slot + kv_head * stride_cache_head
        kv_offsets = row[:, None] + dims[None, :]
        kv_mask = key_valid[:, None] & dim_valid[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        scores = scores.to(tl.float32) * scale
        if USE_SOFTCAP:
            # tanh(x) = 2 * sigmoid(2x) - 1, portable to every Triton backend.
            scores = softcap * (2.0 * tl.sigmoid(2.0 * scores / softcap) - 1.0)
        visible = key_valid[None, :] & (key_position[None, :] <= query_position[:, None])
        if USE_WINDOW:
            visible = visible & (key_position[None, :] > query_position[:, None] - window)
        scores = tl.where(visible, scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, 1))
        # Rows that have seen no visible key yet keep a finite reference so exp() stays 0, never NaN.
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        probs = tl.exp(scores - safe_max[:, None])
        correction = tl.exp(running_max - safe_max)
        running_sum = running_sum * correction + tl.sum(probs, 1)
        if IEEE:
            update = tl.dot(probs.to(v.dtype), v, input_precision="ieee")
        else:
            update = tl.dot(probs.to(v.dtype), v)
        acc = acc * correction[:, None] + update.to(tl.float32)
        running_max = new_max
    return acc, running_max, running_sum


@triton.jit
def _with_sink(acc, running_max, running_sum, sink):
    """The online softmax's state once the sink logit joins it as a key whose value is zero."""
    new_max = tl.maximum(running_max, sink)
    safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
    correction = tl.exp(running_max - safe_max)
    running_sum = running_sum * correction + tl.exp(sink - safe_max)
    return acc * correction[:, None], new_max, running_sum


@triton.jit
def _key_range(  # noqa: PLR0913, PLR0917  (inlined into the kernel: its values, not a call contract)
    first_query_position,
    tile,
    seq_len,
    window,
    split,
    num_splits,
    TILE_TOKENS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    SPLIT: tl.constexpr,
):
    # Keys [key_lo, key_hi) can be visible to some row of this tile; a split takes its own share of them.
    key_hi = tl.minimum(first_query_position + (tile + 1) * TILE_TOKENS, seq_len)
    key_lo = 0
    if USE_WINDOW:
        key_lo = tl.maximum(first_query_position + tile * TILE_TOKENS - window + 1, 0)
    if SPLIT:
        chunk = tl.cdiv(tl.cdiv(key_hi - key_lo, num_splits), BLOCK_N) * BLOCK_N
        key_lo = key_lo + split * chunk
        key_hi = tl.minimum(key_lo + chunk, key_hi)
    return key_lo, key_hi


@triton.jit(do_not_specialize=["stride_table", "num_splits"])
def _paged_attention(  # noqa: PLR0913, PLR0917  (a kernel's signature is its launch contract)
    out_ptr,
    partial_ptr,
    lse_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    work_ptr,
    sinks_ptr,
    scale,
    softcap,
    window,
    num_splits,
    stride_q_token,
    stride_q_head,
    stride_cache_block,
    stride_cache_slot,
    stride_cache_head,
    stride_table,
    GROUPS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TILE_TOKENS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SINKS: tl.constexpr,
    MIXED: tl.constexpr,
    TILES_PER_SEQ: tl.constexpr,
    SPLIT: tl.constexpr,
    IEEE: tl.constexpr,
):
    item = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if MIXED:
        seq = tl.load(work_ptr + 2 * item)
        tile = tl.load(work_ptr + 2 * item + 1)
    else:
        seq = item // TILES_PER_SEQ
        tile = item % TILES_PER_SEQ
    query_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - query_start
    seq_len = tl.load(seq_lens_ptr + seq)
    first_query_position = seq_len - query_len
    rows = tl.arange(0, BLOCK_M)
    token = tile * TILE_TOKENS + rows // GROUPS
    head = kv_head * GROUPS + rows % GROUPS
    row_valid = (rows < TILE_TOKENS * GROUPS) & (token < query_len)
    query_position = first_query_position + token
    dims = tl.arange(0, BLOCK_D)
    io_mask = row_valid[:, None] & (dims < HEAD_DIM)[None, :]
    # Queries and outputs share one layout: [tokens, heads, head_dim], contiguous in head_dim.
    q_offsets = (query_start + token)[:, None] * stride_q_token + head[:, None] * stride_q_head + dims[None, :]
    q = tl.load(q_ptr + q_offsets, mask=io_mask, other=0.0)

    key_lo, key_hi = _key_range(
        first_query_position, tile, seq_len, window, split, num_splits, TILE_TOKENS, BLOCK_N, USE_WINDOW, SPLIT
    )
    acc, running_max, running_sum = _attend_rows(
        q, k_cache_ptr, v_cache_ptr, block_tables_ptr + seq * stride_table, kv_head, query_position, key_lo,
        key_hi, scale, softcap, window, stride_cache_block, stride_cache_slot, stride_cache_head,
        HEAD_DIM, BLOCK_D, PAGE, BLOCK_N, BLOCK_M, USE_SOFTCAP, USE_WINDOW, IEEE,
    )  # fmt: skip
    if USE_SINKS:
        # Splits partition the keys; the sink counts once, in the first.
        sink = tl.load(sinks_ptr + head, mask=row_valid, other=float("-inf")).to(tl.float32)
        sink = tl.where(split == 0, sink, float("-inf"))
        acc, running_max, running_sum = _with_sink(acc, running_max, running_sum, sink)
    out = acc / tl.where(running_sum == 0.0, 1.0, running_sum)[:, None]
    if SPLIT:
        # Partial results [split, token, head, dim] and their log-sum-exp [split, token, head], combined later.
        num_tokens_heads = tl.num_programs(0) * stride_q_token // HEAD_DIM
        partial_row = split * num_tokens_heads + (query_start + token) * (stride_q_token // HEAD_DIM) + head
        tl.store(partial_ptr + partial_row[:, None] * HEAD_DIM + dims[None, :], out, mask=io_mask)
        has_keys = running_sum > 0.0
        lse = tl.where(has_keys, running_max + tl.log(tl.where(has_keys, running_sum, 1.0)), float("-inf"))
        tl.store(lse_ptr + partial_row, lse, mask=row_valid)
    else:
        tl.store(out_ptr + q_offsets, out.to(out_ptr.dtype.element_ty), mask=io_mask)


@triton.jit(do_not_specialize=["num_splits"])
def _combine_splits(  # noqa: PLR0913, PLR0917  (a kernel's signature is its launch contract)
    out_ptr,
    partial_ptr,
    lse_ptr,
    num_splits,
    num_rows,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """One program per (token, head) row: the splits' outputs weighted by their share of the softmax mass."""
    row = tl.program_id(0)
    splits = tl.arange(0, BLOCK_S)
    split_valid = splits < num_splits
    dims = tl.arange(0, BLOCK_D)
    lse = tl.load(lse_ptr + splits * num_rows + row, mask=split_valid, other=float("-inf"))
    top = tl.max(lse, 0)
    weights = tl.exp(lse - tl.where(top == float("-inf"), 0.0, top))
    mask = split_valid[:, None] & (dims < HEAD_DIM)[None, :]
    partial = tl.load(partial_ptr + (splits * num_rows + row)[:, None] * HEAD_DIM + dims[None, :], mask=mask, other=0.0)
    total = tl.sum(weights, 0)
    out = tl.sum(partial * weights[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + row * HEAD_DIM + dims, out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


def pow2_at_least(value: int, floor: int = MIN_DOT_DIM) -> int:
    return max(floor, triton.next_power_of_2(value))


def tile_rows(head_dim: int, dtype: torch.dtype, tile_bytes: int = TILE_BYTES) -> int:
    """Rows (query rows or keys) of one tile: at most 64, and at most `tile_bytes` of `head_dim`-wide rows."""
    row_bytes = pow2_at_least(head_dim) * torch.empty((), dtype=dtype).element_size()
    return max(MIN_DOT_DIM, min(KEY_TILE, tile_bytes // row_bytes))


def tile_config(capability: tuple[int, int], dtype: torch.dtype, head_dim: int) -> TileConfig:
    """The tiles a GPU of compute `capability` runs for `head_dim`-wide heads in `dtype`; refuses head sizes whose
    tiles were never checked against shared memory."""
    if head_dim > MAX_HEAD_DIM:
        major, minor = capability
        raise ConfigError(
            f"the Triton attention kernel has no tiles for head size {head_dim} in "
            f"{str(dtype).removeprefix('torch.')} on a GPU of compute capability {major}.{minor}: its tiles are "
            f"checked to fit shared memory up to head size {MAX_HEAD_DIM} (choose another --attention-backend)"
        )
    narrow_keys = capability not in LARGE_SHARED_MEMORY and dtype == torch.float32
    key_bytes = TILE_BYTES // 2 if narrow_keys else TILE_BYTES
    return TileConfig(query_rows=tile_rows(head_dim, dtype), key_rows=tile_rows(head_dim, dtype, key_bytes))


def query_tile_tokens(groups: int, decode_only: bool, tiles: TileConfig) -> int:
    """Query tokens per program: one on decode-only steps, else as many as fill a tile's rows with their groups."""
    return 1 if decode_only else max(1, tiles.query_rows // groups)


def kernel_constants(
    head_dim: int,
    groups: int,
    page: int,
    tile_tokens: int,
    tiles: TileConfig,
    params: AttentionParams,
    dtype: torch.dtype,
) -> dict[str, int | bool]:
    """The compile-time constants of one launch (also what the ahead-of-time compile test sweeps)."""
    return {
        "GROUPS": groups,
        "HEAD_DIM": head_dim,
        "BLOCK_D": pow2_at_least(head_dim),
        "PAGE": page,
        "BLOCK_N": tiles.key_rows,
        "TILE_TOKENS": tile_tokens,
        "BLOCK_M": pow2_at_least(tile_tokens * groups),
        "USE_SOFTCAP": params.logit_softcap is not None,
        "USE_WINDOW": params.sliding_window is not None,
        "USE_SINKS": params.sinks is not None,
        "IEEE": dtype == torch.float32,
    }


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    paged: PagedLayout,
    params: AttentionParams,
    plan: LaunchPlan,
) -> torch.Tensor:
    """query [tokens, heads, dim] (contiguous) against caches [blocks, block_size, kv_heads, dim]."""
    num_tokens, num_heads, head_dim = query.shape
    _, page, num_kv_heads, _ = key_cache.shape
    output = torch.empty_like(query)
    split = plan.num_splits > 1
    partial = lse = output
    if split:
        partial = torch.empty(
            plan.num_splits, num_tokens, num_heads, head_dim, dtype=torch.float32, device=query.device
        )
        lse = torch.empty(plan.num_splits, num_tokens, num_heads, dtype=torch.float32, device=query.device)
    groups = num_heads // num_kv_heads
    constants = kernel_constants(head_dim, groups, page, plan.tile_tokens, plan.tiles, params, query.dtype)
    _paged_attention[(plan.num_items, num_kv_heads, plan.num_splits)](
        output, partial, lse, query, key_cache, value_cache, paged.block_tables, paged.query_start_loc,
        paged.seq_lens, plan.work if plan.work is not None else paged.seq_lens,
        params.sinks if params.sinks is not None else query, params.scale, params.logit_softcap or 1.0,
        params.sliding_window or 0, plan.num_splits,
        query.stride(0), query.stride(1), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        paged.block_tables.stride(0),
        MIXED=plan.work is not None, TILES_PER_SEQ=plan.tiles_per_seq, SPLIT=split,
        num_warps=plan.tiles.num_warps, num_stages=plan.tiles.num_stages, **constants,
    )  # fmt: skip
    if split:
        rows = num_tokens * num_heads
        _combine_splits[(rows,)](
            output, partial, lse, plan.num_splits, rows,
            HEAD_DIM=head_dim, BLOCK_D=pow2_at_least(head_dim), BLOCK_S=pow2_at_least(plan.num_splits, 2),
        )  # fmt: skip
    return output
