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
class MirrorFill:
    """The cache positions a step copies into the decode mirror: `sources[i]` (a flat cache slot) goes to
    `targets[i]` (row * capacity + position in the mirror's flat view)."""

    sources: torch.Tensor
    targets: torch.Tensor


@dataclass(frozen=True)
class DecodeGroup:
    """Requests contributing exactly one query token each, attended in one padded call."""

    query_rows: torch.Tensor
    # [requests, max_context] flat cache slots, padded with slot 0 where `key_mask` is False.
    key_slots: torch.Tensor
    # [requests, 1, 1, max_context]: True for the request's positions [0, context_len).
    key_mask: torch.Tensor
    # Set when request i holds mirror row i: attention reads the mirror after this fill instead of the blocks.
    mirror: MirrorFill | None = None


@dataclass(frozen=True)
class PagedLayout:
    """The step in the block-table form that paged kernels (flash-attn, Triton, batched SDPA) read."""

    # [sequences + 1] int32: sequence i's query rows are query_start_loc[i]:query_start_loc[i + 1].
    query_start_loc: torch.Tensor
    # [sequences + 1] int32: cumulative seq_lens, the key offsets flash-attn's varlen API expects.
    seq_start_loc: torch.Tensor
    # [sequences] int32: tokens in the cache once this step's K/V are written (cached prefix + this step).
    seq_lens: torch.Tensor
    # [sequences, max_blocks] int32 block ids; entries past a sequence's last block are 0 and never read.
    block_tables: torch.Tensor
    max_query_len: int
    max_seq_len: int
    # Sum of seq_lens, known on the host so gathers need no device round trip.
    num_keys: int
    # Each sequence's query length on the host (the differences of query_start_loc), for launch grids.
    query_lens: tuple[int, ...] = ()

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]


@dataclass(frozen=True)
class AttentionMetadata:
    """Where this step's keys/values go in the cache and what each query token may see."""

    # Flat cache slot (block_id * block_size + offset) of every token in the step, in batch order.
    slot_mapping: torch.Tensor
    # Per-request slot lists for the `torch` backend; empty/None when the backend reads only `paged`.
    prefills: tuple[PrefillSpan, ...]
    decode: DecodeGroup | None
    paged: PagedLayout
