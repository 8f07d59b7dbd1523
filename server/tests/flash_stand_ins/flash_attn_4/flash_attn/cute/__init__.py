"""Stand-in for flash-attn-4's `flash_attn.cute.flash_attn_varlen_func` (CPU tests): upstream's signature and
asserts, float32 math. Like upstream it returns (out, lse)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from flash_contract import check_index_tensor, check_paged_inputs, paged_reference, require


def flash_attn_varlen_func(  # noqa: PLR0913, PLR0917  (upstream's signature, keyword for keyword)
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    seqused_q: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int | None, int | None] = (None, None),
    learnable_sink: torch.Tensor | None = None,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: bool | None = None,
    deterministic: bool = False,
    score_mod: Callable[..., object] | None = None,
    mask_mod: Callable[..., object] | None = None,
    block_sparse_tensors: object | None = None,
    cu_total_m_blocks: torch.Tensor | None = None,
    cu_total_n_blocks: torch.Tensor | None = None,
    aux_tensors: list[torch.Tensor] | None = None,
    return_lse: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Paged varlen calls only: query offsets in cu_seqlens_q, key lengths in seqused_k, pages in page_table."""
    require(page_table is not None and cu_seqlens_q is not None and seqused_k is not None, "paged varlen only")
    assert page_table is not None and cu_seqlens_q is not None and seqused_k is not None
    require(cu_seqlens_k is None, "page_table is not supported with cu_seqlens_k")
    batch = cu_seqlens_q.shape[0] - 1
    check_index_tensor(cu_seqlens_q, "cu_seqlens_q", batch + 1)
    check_index_tensor(seqused_k, "seqused_k", batch)
    check_paged_inputs(q, k, v, page_table, batch)
    require(causal and window_size[1] in (None, 0), "Tandem's attention is causal")
    require(score_mod is None and mask_mod is None and learnable_sink is None, "no score or mask mods")
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    window_left = window_size[0] if window_size[0] is not None and window_size[0] >= 0 else None
    out = paged_reference(q, k, v, cu_seqlens_q, seqused_k, page_table, scale, window_left, softcap)
    return out, None
