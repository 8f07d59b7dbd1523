"""The common metadata of uniform steps at fixed addresses: the attention inputs of captured CUDA graphs.

A captured graph reads the same tensors at every replay, so each step's metadata is copied into these buffers
before its replay, laid out as the graph's shape: `rows` sequences of exactly `tokens_per_row` query tokens each,
row i at tokens [i * tokens_per_row, (i + 1) * tokens_per_row). A decode step is the shape with one token per row;
a step whose rows carry drafts is the shape with one more token than the most drafts.

A request's row holds its own tokens first; the tokens after them, up to the row's width, are padding: they sit
after the request's last position (so causal attention hides them from its own tokens), write their keys and
values into the reserved block, which no request owns, and their outputs are dropped. Rows no request fills are
padding throughout and attend to the reserved block alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem_server.layers.attention.metadata import AttentionMetadata, PagedLayout


def is_decode_only(metadata: AttentionMetadata) -> bool:
    """True when every sequence of the step runs exactly one token."""
    return metadata.paged.max_query_len == 1


@dataclass(frozen=True)
class UniformShape:
    """A captured step's shape: `rows` sequences of `tokens_per_row` query tokens each."""

    rows: int
    tokens_per_row: int

    @property
    def tokens(self) -> int:
        return self.rows * self.tokens_per_row

    def holds(self, num_rows: int, max_query_len: int) -> bool:
        return num_rows <= self.rows and max_query_len <= self.tokens_per_row


@dataclass(frozen=True)
class StaticStepMetadata:
    """Metadata buffers sized for the largest shape; every row starts as padding."""

    slot_mapping: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    # By tokens per row: [max_rows + 1] int32 offsets 0, q, 2q, ... (a uniform step's offsets never change).
    query_start_locs: dict[int, torch.Tensor]
    reserved_block: int
    block_size: int

    @classmethod
    def allocate(
        cls,
        shapes: tuple[UniformShape, ...],
        max_positions: int,
        block_size: int,
        reserved_block: int,
        device: torch.device,
    ) -> StaticStepMetadata:
        """Buffers for `shapes` over contexts of up to `max_positions` tokens.

        A row's padding tokens extend its context past its last position, by fewer tokens than a row holds, so
        the block tables are that much wider; their entries past a row's own blocks are valid block ids (0 or
        left from earlier steps), read only by padding tokens.
        """
        max_rows = max(shape.rows for shape in shapes)
        widest = max(shape.tokens_per_row for shape in shapes)
        width = -(-(max_positions + widest - 1) // block_size)
        buffers = cls(
            slot_mapping=torch.zeros(max(shape.tokens for shape in shapes), dtype=torch.long, device=device),
            seq_lens=torch.zeros(max_rows, dtype=torch.int32, device=device),
            block_tables=torch.zeros(max_rows, width, dtype=torch.int32, device=device),
            query_start_locs={
                shape.tokens_per_row: torch.arange(max_rows + 1, dtype=torch.int32, device=device)
                * shape.tokens_per_row
                for shape in shapes
            },
            reserved_block=reserved_block,
            block_size=block_size,
        )
        buffers.pad_rows(0, max_rows, widest)
        return buffers

    @property
    def max_seq_len(self) -> int:
        return self.block_tables.shape[1] * self.block_size

    def pad_rows(self, start: int, stop: int, tokens_per_row: int) -> None:
        """Turns rows [start, stop) into padding: `tokens_per_row` tokens in the reserved block."""
        self.seq_lens[start:stop] = tokens_per_row
        self.block_tables[start:stop] = self.reserved_block

    def fill(self, metadata: AttentionMetadata, shape: UniformShape, token_rows: torch.Tensor | None) -> None:
        """Copies a step's metadata into the first rows of `shape`, each request's tokens at the start of its row,
        and pads the rest.

        `token_rows[j]` is the row of the step's token j in the shape's layout; None when the step already has
        the shape's layout up to its last request (every request runs exactly `tokens_per_row` tokens).
        """
        paged = metadata.paged
        count, width = paged.block_tables.shape
        tokens_per_row = shape.tokens_per_row
        reserved_slot = self.reserved_block * self.block_size
        if token_rows is None:
            self.slot_mapping[: metadata.slot_mapping.shape[0]].copy_(metadata.slot_mapping, non_blocking=True)
            self.slot_mapping[metadata.slot_mapping.shape[0] : shape.tokens] = reserved_slot
        else:
            self.slot_mapping[: shape.tokens] = reserved_slot
            self.slot_mapping.index_copy_(0, token_rows, metadata.slot_mapping)
        # A request's padding tokens follow its own, so its context grows by their number.
        query_lens = paged.query_start_loc[1:] - paged.query_start_loc[:-1]
        self.seq_lens[:count].copy_(paged.seq_lens + (tokens_per_row - query_lens), non_blocking=True)
        self.block_tables[:count, :width].copy_(paged.block_tables, non_blocking=True)
        self.pad_rows(count, shape.rows, tokens_per_row)

    def view(self, shape: UniformShape) -> AttentionMetadata:
        """Views of `shape`'s rows in the form the attention backends read."""
        rows, tokens_per_row = shape.rows, shape.tokens_per_row
        paged = PagedLayout(
            query_start_loc=self.query_start_locs[tokens_per_row][: rows + 1],
            seq_lens=self.seq_lens[:rows],
            block_tables=self.block_tables[:rows],
            max_query_len=tokens_per_row,
            # An upper bound: the real value changes every step but a graph's host arguments cannot.
            max_seq_len=self.max_seq_len,
            query_lens=(tokens_per_row,) * rows,
        )
        return AttentionMetadata(slot_mapping=self.slot_mapping[: shape.tokens], paged=paged)
