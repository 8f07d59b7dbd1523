"""The `torch` backend's per-step metadata: slot lists per prompt chunk and one padded group for decodes, built
from the common metadata once per step."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from tandem_server.device_copy import to_device
from tandem_server.layers.attention.metadata import AttentionMetadata, HostLayout
from tandem_server.layers.attention.torch_decode_mirror import MirrorSlot


@dataclass(frozen=True)
class PrefillSpan:
    """One request contributing several query tokens (a prompt or a chunk of one)."""

    query_start: int
    query_len: int
    # Flat cache slots of positions [0, context_len), where context_len = num_computed + query_len.
    key_slots: torch.Tensor
    # [query_len, context_len], True where a query may attend (before any sliding window); None means plainly causal
    # from position 0.
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
    # True when `query_rows` is every row of the step, in order (a step of decodes only): the group's output is the
    # step's output as it is.
    every_row: bool = False


@dataclass(frozen=True)
class TorchAttentionMetadata(AttentionMetadata):
    """The common metadata plus the `torch` backend's slot lists."""

    prefills: tuple[PrefillSpan, ...] = ()
    decode: DecodeGroup | None = None


@dataclass(frozen=True)
class MirrorPlacement:
    """This step's mirror rows by request id, and the positions per row of the mirror's tensors."""

    slots: Mapping[int, MirrorSlot]
    capacity: int


def build_torch_metadata(
    common: AttentionMetadata, block_size: int, mirror: MirrorPlacement | None = None
) -> TorchAttentionMetadata:
    """Single-token sequences share one padded decode group; every other sequence is a prefill span.

    With a mirror placement, the decode group lists its requests in mirror-row order and says which positions to
    copy into the mirror's rows.
    """
    host = common.host
    if host is None:
        raise ValueError("invariant: the torch backend's metadata is built from a step with a host layout")
    device = common.slot_mapping.device
    prefills: list[PrefillSpan] = []
    decodes: list[tuple[int, int]] = []
    query_start = 0
    for seq, query_len in enumerate(common.paged.query_lens):
        if query_len == 1:
            decodes.append((seq, query_start))
            query_start += 1
            continue
        prefills.append(prefill_span(query_start, query_len, host, seq, block_size, device))
        query_start += query_len
    decode = _decode_group(common, host, decodes, block_size, mirror, query_start) if decodes else None
    return TorchAttentionMetadata(
        slot_mapping=common.slot_mapping, paged=common.paged, host=host, prefills=tuple(prefills), decode=decode
    )


def prefill_span(
    query_start: int, query_len: int, host: HostLayout, seq: int, block_size: int, device: torch.device
) -> PrefillSpan:
    """Sequence `seq`'s span: its query rows, its context's slots and its chunk mask, on `device`."""
    context_len = host.seq_lens[seq]
    context_slots = _context_slots(host.block_tables[seq], context_len, block_size)
    mask = chunk_mask(context_len - query_len, context_len, host.spans_of(seq))
    return PrefillSpan(
        query_start, query_len, to_device(context_slots, device), None if mask is None else to_device(mask, device)
    )


def _context_slots(block_table: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    # Position p lives at slot block_table[p // block_size] * block_size + p % block_size.
    table = block_table[: -(-length // block_size)].long()
    offsets = torch.arange(block_size, dtype=torch.long)
    return (table.unsqueeze(1) * block_size + offsets).flatten()[:length]


def chunk_mask(start: int, context_len: int, bidirectional: tuple[tuple[int, int], ...] = ()) -> torch.Tensor | None:
    """What the queries at positions [start, context_len) see of keys [0, context_len): the cached prefix and a causal
    triangle over the chunk, and within each `bidirectional` span [begin, end) every position of the span; None
    when that is plainly causal from position 0."""
    if start == 0 and not bidirectional:
        return None
    query_positions = torch.arange(start, context_len).unsqueeze(1)
    key_positions = torch.arange(context_len).unsqueeze(0)
    visible = key_positions <= query_positions
    for begin, end in bidirectional:
        query_inside = (query_positions >= begin) & (query_positions < end)
        visible |= query_inside & (key_positions >= begin) & (key_positions < end)
    return visible


def _decode_group(
    common: AttentionMetadata,
    host: HostLayout,
    decodes: list[tuple[int, int]],
    block_size: int,
    mirror: MirrorPlacement | None,
    step_rows: int,
) -> DecodeGroup:
    # `decodes` holds (sequence, query row) of every single-token sequence; the step has `step_rows` query rows.
    slots = _mirror_slots(host, [seq for seq, _ in decodes], mirror)
    if slots is not None:
        # Request i of the group must be the one holding mirror row i.
        found = slots
        order = sorted(range(len(decodes)), key=lambda i: found[i].row)
        decodes, slots = [decodes[i] for i in order], [found[i] for i in order]
    seqs = [seq for seq, _ in decodes]
    device = common.slot_mapping.device
    context_lens = torch.tensor([host.seq_lens[seq] for seq in seqs], dtype=torch.long)
    max_context = int(context_lens.max())
    columns = torch.arange(max_context, dtype=torch.long)
    tables = host.block_tables[seqs].long()
    in_context = columns.unsqueeze(0) < context_lens.unsqueeze(1)
    key_slots = torch.where(in_context, tables[:, columns // block_size] * block_size + columns % block_size, 0)
    fill = None
    if slots is not None and mirror is not None:
        for i, slot in enumerate(slots):
            if slot.row != i:
                raise ValueError(f"invariant: the mirror rows of a decode group are 0..{len(seqs) - 1}")
        copied = torch.tensor([slot.copied for slot in slots], dtype=torch.long)
        missing = in_context & (columns.unsqueeze(0) >= copied.unsqueeze(1))
        targets = torch.arange(len(seqs), dtype=torch.long).unsqueeze(1) * mirror.capacity + columns
        fill = MirrorFill(to_device(key_slots[missing], device), to_device(targets[missing], device))
    rows = [row for _, row in decodes]
    return DecodeGroup(
        query_rows=torch.tensor(rows, dtype=torch.long, device=device),
        key_slots=to_device(key_slots, device),
        key_mask=to_device(in_context.view(len(seqs), 1, 1, max_context), device),
        mirror=fill,
        every_row=rows == list(range(step_rows)),
    )


def _mirror_slots(host: HostLayout, seqs: list[int], mirror: MirrorPlacement | None) -> list[MirrorSlot] | None:
    # The group reads the mirror only when every one of its requests holds a row.
    if mirror is None or not host.request_ids:
        return None
    slots = [mirror.slots.get(host.request_ids[seq]) for seq in seqs]
    if any(slot is None for slot in slots):
        return None
    return [slot for slot in slots if slot is not None]
