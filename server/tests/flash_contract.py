"""What FlashAttention's paged varlen entry points refuse, and a float32 reference of what they compute.

The stand-in `flash_attn` (flash-attn 2) and `flash_attn.cute` (flash-attn-4) packages under `flash_stand_ins/`
are built from these, so CPU tests drive the flash backend through the same contract the CUDA kernels enforce
(flash-attn 2: `mha_varlen_fwd`'s TORCH_CHECKs; flash-attn-4: `_flash_attn_fwd`'s asserts). Only the device
checks are left out: the stand-ins run on the CPU.
"""

from __future__ import annotations

import torch

HALF_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256
HEAD_DIM_ALIGNMENT = 8


class FlashContractError(RuntimeError):
    """A call upstream would refuse."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise FlashContractError(message)


def check_index_tensor(tensor: torch.Tensor, name: str, length: int) -> None:
    """cu_seqlens / seqused: int32, contiguous, one entry per sequence (plus one for offsets)."""
    require(tensor.dtype == torch.int32, f"{name} must have dtype int32")
    require(tensor.is_contiguous(), f"{name} must be contiguous")
    require(tuple(tensor.shape) == (length,), f"{name} must have shape ({length},), not {tuple(tensor.shape)}")


def check_paged_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, batch: int) -> None:
    """Dtypes, contiguous last dims, paged K/V shapes, head size and head-group divisibility, the page table."""
    require(q.dtype in HALF_DTYPES, "FlashAttention only supports fp16 and bf16 data type")
    require(k.dtype == q.dtype and v.dtype == q.dtype, "query, key and value must have the same dtype")
    for tensor in (q, k, v):
        require(tensor.stride(-1) == 1, "Input tensor must have contiguous last dimension")
    require(q.dim() == 3, "varlen query is [total_q, heads, head_dim]")
    require(k.dim() == 4 and v.shape == k.shape, "paged K/V are [num_pages, page_size, kv_heads, head_dim]")
    num_heads, head_dim = q.shape[1:]
    require(k.shape[-1] == head_dim, "key head size must equal the query's")
    require(head_dim <= MAX_HEAD_DIM, "FlashAttention forward only supports head dimension at most 256")
    require(head_dim % HEAD_DIM_ALIGNMENT == 0, "head dimension must be divisible by 8")
    require(num_heads % k.shape[2] == 0, "Number of heads in key/value must divide number of heads in query")
    require(table.dtype == torch.int32, "block_table must have dtype torch.int32")
    require(table.stride(-1) == 1, "block_table must have contiguous last dimension")
    require(table.dim() == 2 and table.shape[0] == batch, "block_table must be [batch, max_pages_per_sequence]")


def paged_reference(  # noqa: PLR0913, PLR0917  (the parameters of the kernel it stands in for)
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    table: torch.Tensor,
    scale: float,
    window_left: int | None,
    softcap: float,
) -> torch.Tensor:
    """Causal attention aligned to each sequence's end, computed in float32 from the pages the table names."""
    page_size, num_kv_heads, head_dim = k_pages.shape[1:]
    groups = q.shape[1] // num_kv_heads
    outputs = []
    for sequence, seq_len in enumerate(seq_lens.tolist()):
        start, stop = cu_seqlens_q[sequence].item(), cu_seqlens_q[sequence + 1].item()
        pages = table[sequence, : -(-seq_len // page_size)].long()
        keys = k_pages[pages].reshape(-1, num_kv_heads, head_dim)[:seq_len].float()
        values = v_pages[pages].reshape(-1, num_kv_heads, head_dim)[:seq_len].float()
        keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[start:stop].float(), keys) * scale
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        query_positions = torch.arange(seq_len - (stop - start), seq_len).unsqueeze(1)
        key_positions = torch.arange(seq_len).unsqueeze(0)
        visible = key_positions <= query_positions
        if window_left is not None:
            visible &= key_positions >= query_positions - window_left
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        outputs.append(torch.einsum("hqk,khd->qhd", probs, values))
    return torch.cat(outputs).to(q.dtype)
