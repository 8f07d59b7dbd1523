"""Builds one step's flat tensors: input ids, positions, cache slots and attention metadata."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tandem_server.engine.decode_mirror import MirrorSlot
from tandem_server.layers.attention import AttentionMetadata, DecodeGroup, MirrorFill, PagedLayout, PrefillSpan


@dataclass(frozen=True)
class ScheduledSpan:
    """One request's tokens in this step: `token_ids` occupy positions start_position, start_position+1, ..."""

    token_ids: Sequence[int]
    start_position: int
    block_table: Sequence[int]
    # The request's decode-mirror row when this step's decodes attend through the mirror.
    mirror: MirrorSlot | None = None

    @property
    def context_len(self) -> int:
        return self.start_position + len(self.token_ids)


@dataclass(frozen=True)
class StepBatch:
    """The model's inputs for one step; `last_rows[i]` is the row of span i's final token."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata
    last_rows: tuple[int, ...]


def build_step_batch(
    spans: Sequence[ScheduledSpan],
    block_size: int,
    device: torch.device,
    slot_lists: bool = True,
    mirror_capacity: int = 0,
) -> StepBatch:
    """Flattens the spans in order; single-token spans share one padded decode group.

    `slot_lists=False` skips the per-request slot lists only the `torch` backend reads; paged kernels need
    just the block-table layout, which is always built. When the single-token spans carry mirror slots, the decode
    group lists them in row order and says which positions to copy into rows of `mirror_capacity` positions.
    """
    if not slot_lists:
        return _paged_only_batch(spans, block_size, device)
    input_ids: list[int] = []
    positions: list[torch.Tensor] = []
    slot_mapping: list[torch.Tensor] = []
    prefills: list[PrefillSpan] = []
    decode_rows: list[int] = []
    decode_spans: list[ScheduledSpan] = []
    last_rows: list[int] = []
    row = 0
    for span in spans:
        num_tokens = len(span.token_ids)
        context_slots = _context_slots(span.block_table, span.context_len, block_size)
        input_ids.extend(span.token_ids)
        positions.append(torch.arange(span.start_position, span.context_len))
        slot_mapping.append(context_slots[span.start_position :])
        if num_tokens == 1:
            decode_rows.append(row)
            decode_spans.append(span)
        else:
            mask = _chunk_mask(span.start_position, span.context_len)
            prefills.append(PrefillSpan(row, num_tokens, context_slots.to(device), _to(mask, device)))
        row += num_tokens
        last_rows.append(row - 1)
    metadata = AttentionMetadata(
        slot_mapping=torch.cat(slot_mapping).to(device),
        prefills=tuple(prefills),
        decode=_decode_group(decode_rows, decode_spans, block_size, device, mirror_capacity) if decode_rows else None,
        paged=paged_layout(spans, block_size, device),
    )
    return StepBatch(
        input_ids=torch.tensor(input_ids, dtype=torch.long, device=device),
        positions=torch.cat(positions).to(device),
        metadata=metadata,
        last_rows=tuple(last_rows),
    )


def _paged_only_batch(spans: Sequence[ScheduledSpan], block_size: int, device: torch.device) -> StepBatch:
    input_ids = [token for span in spans for token in span.token_ids]
    positions = [position for span in spans for position in range(span.start_position, span.context_len)]
    slots = [
        span.block_table[position // block_size] * block_size + position % block_size
        for span in spans
        for position in range(span.start_position, span.context_len)
    ]
    last_rows = [end - 1 for end in itertools.accumulate(len(span.token_ids) for span in spans)]
    metadata = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long).to(device),
        prefills=(),
        decode=None,
        paged=paged_layout(spans, block_size, device),
    )
    return StepBatch(
        input_ids=torch.tensor(input_ids, dtype=torch.long).to(device),
        positions=torch.tensor(positions, dtype=torch.long).to(device),
        metadata=metadata,
        last_rows=tuple(last_rows),
    )


def paged_layout(spans: Sequence[ScheduledSpan], block_size: int, device: torch.device) -> PagedLayout:
    """Block tables, query offsets and sequence lengths of the spans, as int32 tensors on `device`."""
    query_lens = [len(span.token_ids) for span in spans]
    seq_lens = [span.context_len for span in spans]
    tables = [span.block_table[: -(-span.context_len // block_size)] for span in spans]
    width = max(len(table) for table in tables)
    block_tables = torch.zeros(len(spans), width, dtype=torch.int32)
    for row, table in enumerate(tables):
        block_tables[row, : len(table)] = torch.tensor(table, dtype=torch.int32)
    return PagedLayout(
        query_start_loc=_offsets(query_lens).to(device),
        seq_start_loc=_offsets(seq_lens).to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32).to(device),
        block_tables=block_tables.to(device),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        num_keys=sum(seq_lens),
        query_lens=tuple(query_lens),
    )


def _offsets(lengths: Sequence[int]) -> torch.Tensor:
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    offsets[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
    return offsets


def _context_slots(block_table: Sequence[int], length: int, block_size: int) -> torch.Tensor:
    # Position p lives at slot block_table[p // block_size] * block_size + p % block_size.
    table = torch.tensor(block_table[: -(-length // block_size)], dtype=torch.long)
    offsets = torch.arange(block_size, dtype=torch.long)
    return (table.unsqueeze(1) * block_size + offsets).flatten()[:length]


def _chunk_mask(start: int, context_len: int) -> torch.Tensor | None:
    # A chunk at an offset sees the whole cached prefix plus a causal triangle over itself.
    if start == 0:
        return None
    query_positions = torch.arange(start, context_len).unsqueeze(1)
    return torch.arange(context_len).unsqueeze(0) <= query_positions


def _decode_group(
    rows: list[int], spans: list[ScheduledSpan], block_size: int, device: torch.device, mirror_capacity: int
) -> DecodeGroup:
    mirrored = all(span.mirror is not None for span in spans)
    if mirrored:
        # Request i of the group must be the one holding mirror row i.
        order = sorted(range(len(spans)), key=lambda i: _mirror_slot(spans[i]).row)
        rows, spans = [rows[i] for i in order], [spans[i] for i in order]
    max_context = max(span.context_len for span in spans)
    key_slots = torch.zeros(len(spans), max_context, dtype=torch.long)
    key_mask = torch.zeros(len(spans), max_context, dtype=torch.bool)
    sources, targets = [], []
    for i, span in enumerate(spans):
        context_slots = _context_slots(span.block_table, span.context_len, block_size)
        key_slots[i, : span.context_len] = context_slots
        key_mask[i, : span.context_len] = True
        if mirrored:
            slot = _mirror_slot(span)
            if slot.row != i:
                raise ValueError(f"invariant: the mirror rows of a decode group are 0..{len(spans) - 1}")
            sources.append(context_slots[slot.copied :])
            targets.append(torch.arange(slot.copied, span.context_len) + i * mirror_capacity)
    mirror = MirrorFill(torch.cat(sources).to(device), torch.cat(targets).to(device)) if mirrored else None
    return DecodeGroup(
        query_rows=torch.tensor(rows, dtype=torch.long, device=device),
        key_slots=key_slots.to(device),
        key_mask=key_mask.view(len(spans), 1, 1, max_context).to(device),
        mirror=mirror,
    )


def _mirror_slot(span: ScheduledSpan) -> MirrorSlot:
    if span.mirror is None:
        raise ValueError("invariant: every span of a mirrored decode group has a mirror slot")
    return span.mirror


def _to(tensor: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(device)
