"""Stand-in for flash-attn 2's `flash_attn_varlen_func` (CPU tests): upstream's signature and checks, float32 math."""

from __future__ import annotations

import torch
from flash_contract import check_index_tensor, check_paged_inputs, paged_reference, require

PAGE_MULTIPLE = 256


def flash_attn_varlen_func(  # noqa: PLR0913, PLR0917  (upstream's signature, keyword for keyword)
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: torch.Tensor | None = None,
) -> torch.Tensor:
    """Paged calls only: Tandem never hands flash-attn 2 a contiguous K/V."""
    require(block_table is not None, "the stand-in models the paged path only")
    assert block_table is not None
    batch = cu_seqlens_q.shape[0] - 1
    require(batch > 0, "batch size must be positive")
    check_index_tensor(cu_seqlens_q, "cu_seqlens_q", batch + 1)
    check_index_tensor(cu_seqlens_k, "cu_seqlens_k", batch + 1)
    check_paged_inputs(q, k, v, block_table, batch)
    require(k.shape[1] % PAGE_MULTIPLE == 0, "Paged KV cache block size must be divisible by 256")
    require(causal and window_size[1] in (-1, 0), "Tandem's attention is causal")
    require(dropout_p == 0.0 and alibi_slopes is None and not return_attn_probs, "inference only")
    require(isinstance(max_seqlen_q, int) and isinstance(max_seqlen_k, int), "max_seqlen_q/k are host integers")
    seq_lens = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
    require(int(seq_lens.max()) <= max_seqlen_k, "max_seqlen_k bounds every sequence")
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    window_left = window_size[0] if window_size[0] >= 0 else None
    return paged_reference(q, k, v, cu_seqlens_q, seq_lens, block_table, scale, window_left, softcap)
