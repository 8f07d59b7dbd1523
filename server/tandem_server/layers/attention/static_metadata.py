"""The common metadata of decode-only steps at fixed addresses: the attention inputs of captured CUDA graphs.

A captured graph reads the same tensors at every replay, so each step's metadata is copied into these buffers
before its replay, its batch padded up to the captured size. Padding rows write position 0 of the reserved block,
which no request owns, and attend to it alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem_server.layers.attention.metadata import AttentionMetadata, PagedLayout


def is_decode_only(metadata: AttentionMetadata) -> bool:
    """True when every sequence of the step runs exactly one token."""
    return metadata.paged.max_query_len == 1


@dataclass(frozen=True)
class StaticDecodeMetadata:
    """Decode metadata buffers sized for the largest batch; row i is sequence i."""

    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    reserved_block: int
    block_size: int

    @classmethod
    def allocate(
        cls, max_batch: int, max_positions: int, block_size: int, reserved_block: int, device: torch.device
    ) -> StaticDecodeMetadata:
        """Buffers for up to `max_batch` sequences whose contexts reach `max_positions` tokens, all rows padding."""
        width = -(-max_positions // block_size)
        buffers = cls(
            slot_mapping=torch.zeros(max_batch, dtype=torch.long, device=device),
            # Every decode sequence has exactly one query row, so the offsets are 0, 1, 2, ...
            query_start_loc=torch.arange(max_batch + 1, dtype=torch.int32, device=device),
            seq_lens=torch.zeros(max_batch, dtype=torch.int32, device=device),
            block_tables=torch.zeros(max_batch, width, dtype=torch.int32, device=device),
            reserved_block=reserved_block,
            block_size=block_size,
        )
        buffers.pad(0, max_batch)
        return buffers

    @property
    def max_positions(self) -> int:
        return self.block_tables.shape[1] * self.block_size

    def pad(self, start: int, stop: int) -> None:
        """Turns rows [start, stop) into padding: one token at position 0 of the reserved block."""
        self.slot_mapping[start:stop] = self.reserved_block * self.block_size
        self.seq_lens[start:stop] = 1
        self.block_tables[start:stop, 0] = self.reserved_block

    def fill(self, metadata: AttentionMetadata, size: int) -> None:
        """Copies a decode-only step's metadata into rows [0, n) and pads rows [n, size) for the graph of `size`."""
        paged = metadata.paged
        count, width = paged.block_tables.shape
        self.slot_mapping[:count].copy_(metadata.slot_mapping, non_blocking=True)
        self.seq_lens[:count].copy_(paged.seq_lens, non_blocking=True)
        self.block_tables[:count, :width].copy_(paged.block_tables, non_blocking=True)
        self.pad(count, size)

    def view(self, size: int) -> AttentionMetadata:
        """Views of the first `size` rows in the form the attention backends read."""
        paged = PagedLayout(
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size],
            max_query_len=1,
            # Upper bounds: the real values change every step but a graph's host arguments cannot.
            max_seq_len=self.max_positions,
            query_lens=(1,) * size,
        )
        return AttentionMetadata(slot_mapping=self.slot_mapping[:size], paged=paged)
