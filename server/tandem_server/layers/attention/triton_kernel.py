"""A paged-attention Triton kernel for mixed prefill/decode steps; imported only when the Triton backend is built.

One program handles one sequence, one tile of its query tokens and one KV head; the query heads sharing that KV
head are stacked into the tile's rows, so each cache page is loaded once for the whole group (grouped-query
attention). Pages are visited in block-table order with an online softmax, so no score matrix is materialised.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tandem_server.layers.attention.backend import AttentionParams
from tandem_server.layers.attention.metadata import PagedLayout

# Rows of a prefill tile (query tokens x grouped heads); decode-only steps use one token per tile instead.
_PREFILL_TILE_ROWS = 64
# tl.dot needs every tile dimension to be at least 16.
_MIN_DOT_DIM = 16


@triton.jit
def _paged_attention(  # noqa: PLR0913, PLR0917  (a kernel's signature is its launch contract)
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    scale,
    softcap,
    window,
    stride_q_token,
    stride_q_head,
    stride_o_token,
    stride_o_head,
    stride_cache_block,
    stride_cache_slot,
    stride_cache_head,
    stride_table,
    GROUPS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_PAGE: tl.constexpr,
    TILE_TOKENS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_WINDOW: tl.constexpr,
):
    seq = tl.program_id(0)
    tile = tl.program_id(1)
    kv_head = tl.program_id(2)
    query_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - query_start
    if tile * TILE_TOKENS < query_len:
        seq_len = tl.load(seq_lens_ptr + seq)
        first_query_position = seq_len - query_len
        rows = tl.arange(0, BLOCK_M)
        token = tile * TILE_TOKENS + rows // GROUPS
        head = kv_head * GROUPS + rows % GROUPS
        row_valid = (rows < TILE_TOKENS * GROUPS) & (token < query_len)
        query_position = first_query_position + token
        dims = tl.arange(0, BLOCK_D)
        dim_valid = dims < HEAD_DIM
        q_offsets = (query_start + token)[:, None] * stride_q_token + head[:, None] * stride_q_head + dims[None, :]
        q = tl.load(q_ptr + q_offsets, mask=row_valid[:, None] & dim_valid[None, :], other=0.0)

        # Keys [key_lo, key_hi) can be visible to some row of this tile.
        key_hi = tl.minimum(first_query_position + (tile + 1) * TILE_TOKENS, seq_len)
        key_lo = 0
        if USE_WINDOW:
            key_lo = tl.maximum(first_query_position + tile * TILE_TOKENS - window + 1, 0)
        running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        running_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        slots = tl.arange(0, BLOCK_PAGE)
        for page in range(key_lo // PAGE, tl.cdiv(key_hi, PAGE)):
            block = tl.load(block_tables_ptr + seq * stride_table + page).to(tl.int64)
            key_position = page * PAGE + slots
            key_valid = (slots < PAGE) & (key_position < key_hi)
            kv_offsets = (
                block * stride_cache_block
                + slots[:, None] * stride_cache_slot
                + kv_head * stride_cache_head
                + dims[None, :]
            )
            kv_mask = key_valid[:, None] & dim_valid[None, :]
            k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
            v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
            scores = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
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
            acc = acc * correction[:, None] + tl.dot(probs.to(v.dtype), v).to(tl.float32)
            running_max = new_max
        out = acc / tl.where(running_sum == 0.0, 1.0, running_sum)[:, None]
        o_offsets = (query_start + token)[:, None] * stride_o_token + head[:, None] * stride_o_head + dims[None, :]
        tl.store(out_ptr + o_offsets, out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & dim_valid[None, :])


def _pow2_at_least(value: int, floor: int = _MIN_DOT_DIM) -> int:
    return max(floor, triton.next_power_of_2(value))


def paged_attention(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, paged: PagedLayout, params: AttentionParams
) -> torch.Tensor:
    """query [tokens, heads, dim] against caches [blocks, block_size, kv_heads, dim] -> [tokens, heads, dim]."""
    num_heads, head_dim = query.shape[1:]
    _, page, num_kv_heads, _ = key_cache.shape
    groups = num_heads // num_kv_heads
    tile_tokens = 1 if paged.max_query_len == 1 else max(1, _PREFILL_TILE_ROWS // groups)
    output = torch.empty_like(query)
    grid = (paged.num_seqs, triton.cdiv(paged.max_query_len, tile_tokens), num_kv_heads)
    _paged_attention[grid](
        output,
        query,
        key_cache,
        value_cache,
        paged.block_tables,
        paged.query_start_loc,
        paged.seq_lens,
        params.scale,
        params.logit_softcap or 1.0,
        params.sliding_window or 0,
        query.stride(0),
        query.stride(1),
        output.stride(0),
        output.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        paged.block_tables.stride(0),
        GROUPS=groups,
        HEAD_DIM=head_dim,
        BLOCK_D=_pow2_at_least(head_dim),
        PAGE=page,
        BLOCK_PAGE=_pow2_at_least(page),
        TILE_TOKENS=tile_tokens,
        BLOCK_M=_pow2_at_least(tile_tokens * groups),
        USE_SOFTCAP=params.logit_softcap is not None,
        USE_WINDOW=params.sliding_window is not None,
    )
    return output
