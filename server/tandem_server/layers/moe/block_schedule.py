"""The fused MoE kernel's block schedule: the step's token-expert pairs laid out by expert in whole blocks of rows,
each block owned by one expert, in tensors whose shapes follow from the pair count alone.

Each expert's run of pairs is padded to a multiple of `block_m` rows; a padding row holds the pair count (no pair).
The schedule always has `max_blocks` blocks, the most the padding can need, so the launch grid is known without
reading the routing on the host and a CUDA graph can capture the step; blocks past the last expert's run belong to
expert `num_experts` (none) and their programs return at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem_server.layers.moe.routing import group_by_expert


@dataclass(frozen=True)
class BlockSchedule:
    """Which pair each padded row holds and which expert each block of `block_m` rows belongs to."""

    # int32 `[max_blocks * block_m]`: the index of each row's pair among the `[tokens * top_k]` flattened pairs, or
    # the pair count for a padding row.
    pair_rows: torch.Tensor
    # int32 `[max_blocks]`: each block's expert, `num_experts` for a block no expert needs.
    block_experts: torch.Tensor
    block_m: int


def max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """The most blocks `num_pairs` pairs can fill: each expert with pairs adds under one block of padding, and at
    most `min(num_experts, num_pairs)` experts have pairs."""
    experts_with_pairs = min(num_experts, num_pairs)
    return (num_pairs + experts_with_pairs * (block_m - 1)) // block_m


def schedule_blocks(experts: torch.Tensor, num_experts: int, block_m: int) -> BlockSchedule:
    """The schedule for the chosen experts `[tokens, top_k]`, computed on their device with no host read."""
    num_pairs = experts.numel()
    groups = group_by_expert(experts, num_experts)
    ends = groups.ends.long()
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    blocks_per_expert = (counts + block_m - 1) // block_m
    block_ends = blocks_per_expert.cumsum(0)
    padded_starts = (block_ends - blocks_per_expert) * block_m
    sorted_experts = experts.reshape(-1)[groups.order]
    rank_in_expert = torch.arange(num_pairs, device=experts.device) - (ends - counts)[sorted_experts]
    rows = padded_starts[sorted_experts] + rank_in_expert
    blocks = max_blocks(num_pairs, num_experts, block_m)
    pair_rows = torch.full((blocks * block_m,), num_pairs, dtype=torch.int32, device=experts.device)
    pair_rows.index_copy_(0, rows, groups.order.to(torch.int32))
    block_ids = torch.arange(blocks, device=experts.device)
    block_experts = torch.searchsorted(block_ends, block_ids, right=True).to(torch.int32)
    return BlockSchedule(pair_rows, block_experts, block_m)
