"""Builds one step's flat tensors: input ids, positions, cache slots and the common attention metadata."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tandem_server.device_copy import to_device
from tandem_server.layers.attention import AttentionMetadata, HostLayout, PagedLayout, start_offsets
from tandem_server.layers.embedding import InputEmbeddings
from tandem_server.lora import LoraStep


@dataclass(frozen=True)
class ScheduledSpan:
    """One request's tokens in this step: `token_ids` occupy positions start_position, start_position+1, ..."""

    token_ids: Sequence[int]
    start_position: int
    block_table: Sequence[int]
    # The request the tokens belong to; None for steps of no request (warm-up, health checks).
    request_id: int | None = None
    # The position ranges [start, end) the tokens reach whose positions attend to each other in both directions.
    bidirectional_spans: tuple[tuple[int, int], ...] = ()

    @property
    def context_len(self) -> int:
        return self.start_position + len(self.token_ids)


@dataclass(frozen=True)
class StepBatch:
    """The model's inputs for one step; `last_rows[i]` is the row of span i's final token."""

    input_ids: torch.Tensor
    # Each row's rotary position `[tokens]`: its sequence position, unless its request's image grids move it
    # (engine/grid_positions.py); `[3, tokens]` (temporal, height, width) where some row's three differ.
    positions: torch.Tensor
    metadata: AttentionMetadata
    last_rows: tuple[int, ...]
    # The LoRA adapters some rows run under; None: every row runs the base model alone.
    lora: LoraStep | None = None
    # The rows that run on given embeddings (an image's positions); None: every row runs on its token's.
    embeddings: InputEmbeddings | None = None

    @property
    def runs_base_model(self) -> bool:
        """True when every row runs the base model on its token's embedding at one rotary position: the steps a
        captured or compiled graph of the model can replay."""
        return self.lora is None and self.embeddings is None and self.positions.dim() == 1


def build_step_batch(
    spans: Sequence[ScheduledSpan], block_size: int, device: torch.device, lora: LoraStep | None = None
) -> StepBatch:
    """Flattens the spans in order into the model's inputs and the metadata every attention backend reads; `lora`
    carries the deltas of the rows run under adapters."""
    query_lens = [len(span.token_ids) for span in spans]
    seq_lens = [span.context_len for span in spans]
    tables = [span.block_table[: -(-span.context_len // block_size)] for span in spans]
    block_tables = torch.zeros(len(spans), max(len(table) for table in tables), dtype=torch.int32)
    for row, table in enumerate(tables):
        block_tables[row, : len(table)] = torch.tensor(table, dtype=torch.int32)
    query_offsets = start_offsets(query_lens)
    num_tokens = int(query_offsets[-1])
    # Sequence of each token, then its position: the sequence's first new position plus its index in the query.
    sequence = torch.repeat_interleave(torch.arange(len(spans)), torch.tensor(query_lens), output_size=num_tokens)
    starts = torch.tensor([span.start_position for span in spans], dtype=torch.long)
    positions = starts[sequence] + torch.arange(num_tokens) - query_offsets[:-1].long()[sequence]
    # Position p of a sequence lives at slot block_table[p // block_size] * block_size + p % block_size.
    slots = block_tables[sequence, positions // block_size].long() * block_size + positions % block_size
    known_ids = tuple(span.request_id for span in spans if span.request_id is not None)
    paged = PagedLayout(
        query_start_loc=to_device(query_offsets, device),
        seq_lens=to_device(torch.tensor(seq_lens, dtype=torch.int32), device),
        block_tables=to_device(block_tables, device),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_lens=tuple(query_lens),
    )
    host = HostLayout(
        seq_lens=tuple(seq_lens),
        block_tables=block_tables,
        request_ids=known_ids if len(known_ids) == len(spans) else (),
        bidirectional_spans=tuple(span.bidirectional_spans for span in spans),
    )
    return StepBatch(
        input_ids=to_device(
            torch.tensor([token for span in spans for token in span.token_ids], dtype=torch.long), device
        ),
        positions=to_device(positions, device),
        metadata=AttentionMetadata(slot_mapping=to_device(slots, device), paged=paged, host=host),
        last_rows=tuple(int(end) - 1 for end in query_offsets[1:]),
        lora=lora,
    )
