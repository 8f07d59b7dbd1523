"""Per-step attention metadata, built once per step and passed explicitly to every layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PrefillSpan:
    """One request contributing several query tokens (a prompt or a chunk of one)."""

    query_start: int
    query_len: int
    # Flat cache slots of positions [0, context_len), where context_len = num_computed + query_len.
    key_slots: torch.Tensor
    # [query_len, context_len], True where a query may attend; None means plainly causal from position 0.
    mask: torch.Tensor | None


@dataclass(frozen=True)
class DecodeGroup:
    """Requests contributing exactly one query token each, attended in one padded call."""

    query_rows: torch.Tensor
    # [requests, max_context] flat cache slots, padded with slot 0 where `key_mask` is False.
    key_slots: torch.Tensor
    # [requests, 1, 1, max_context]: True for the request's positions [0, context_len).
    key_mask: torch.Tensor


@dataclass(frozen=True)
class AttentionMetadata:
    """Where this step's keys/values go in the cache and what each query token may see."""

    # Flat cache slot (block_id * block_size + offset) of every token in the step, in batch order.
    slot_mapping: torch.Tensor
    prefills: tuple[PrefillSpan, ...]
    decode: DecodeGroup | None
