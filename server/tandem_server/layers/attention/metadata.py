"""Per-step attention metadata every backend reads, built once per step and passed explicitly to every layer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PagedLayout:
    """The step in block-table form: one sequence per scheduled request, in batch order."""

    # [sequences + 1] int32: sequence i's query rows are query_start_loc[i]:query_start_loc[i + 1].
    query_start_loc: torch.Tensor
    # [sequences] int32: tokens in the cache once this step's K/V are written (cached prefix + this step).
    seq_lens: torch.Tensor
    # [sequences, max_blocks] int32 block ids; entries past a sequence's last block are 0 and never read.
    block_tables: torch.Tensor
    max_query_len: int
    max_seq_len: int
    # Each sequence's query length on the host (the differences of query_start_loc), for launch grids.
    query_lens: tuple[int, ...] = ()

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]


def start_offsets(lengths: Sequence[int]) -> torch.Tensor:
    """[len(lengths) + 1] int32 on the host: 0 then the running sums, the form of `PagedLayout.query_start_loc`."""
    return torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)


@dataclass(frozen=True)
class HostLayout:
    """The step's sequences on the host, for backends that build their own metadata on the CPU."""

    # Each sequence's seq_len.
    seq_lens: tuple[int, ...]
    # [sequences, max_blocks] int32: the same rows as PagedLayout.block_tables.
    block_tables: torch.Tensor
    # The request each sequence belongs to; empty for steps of no request (warm-up, health checks).
    request_ids: tuple[int, ...] = ()
    # Per sequence, the position ranges [start, end) this step's queries reach whose positions attend to each other
    # in both directions (Gemma 3's image spans); empty: every sequence is causal. A step's queries never end strictly
    # inside a span, so every key a span's query sees is cached or in the step; a step listing any span runs on given
    # embeddings, which no captured or compiled graph replays.
    bidirectional_spans: tuple[tuple[tuple[int, int], ...], ...] = ()

    def spans_of(self, seq: int) -> tuple[tuple[int, int], ...]:
        """Sequence `seq`'s bidirectional spans."""
        return self.bidirectional_spans[seq] if self.bidirectional_spans else ()


@dataclass(frozen=True)
class AttentionMetadata:
    """Where this step's keys/values go in the cache and what each query token may see."""

    # Flat cache slot (block_id * block_size + offset) of every token in the step, in batch order.
    slot_mapping: torch.Tensor
    paged: PagedLayout
    # None where only device tensors exist (a captured graph's inputs).
    host: HostLayout | None = None
