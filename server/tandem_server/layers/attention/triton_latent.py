"""The Triton backend's metadata for multi-head latent attention (MLA) steps: prompt chunks as slot lists for the
expanded form, decode rows as the sequences the absorbed-decode kernel reads through the block tables."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem_server.device_copy import to_device
from tandem_server.layers.attention.latent_step import LatentLayout
from tandem_server.layers.attention.metadata import AttentionMetadata
from tandem_server.layers.attention.torch_metadata import PrefillSpan, prefill_span


@dataclass(frozen=True)
class TritonLatentMetadata(AttentionMetadata):
    """The common metadata plus the split of a latent step's rows."""

    prefills: tuple[PrefillSpan, ...] = ()
    # As `LatentLayout.decode_rows`.
    decode_rows: torch.Tensor | slice | None = None
    # [decodes] int32: the sequence of each decode row; None: decode row i is sequence i (every row decodes).
    decode_seqs: torch.Tensor | None = None
    # The longest context of a decode row, on the host: it bounds how far the kernel splits the keys.
    decode_max_seq_len: int = 0

    @property
    def layout(self) -> LatentLayout:
        return LatentLayout(self.prefills, self.decode_rows)


def build_latent_metadata(common: AttentionMetadata, block_size: int) -> TritonLatentMetadata:
    """Single-token sequences decode through the kernel; every other sequence is a prefill span. A step with no host
    layout (a captured graph's) must be decodes only, read straight from the device layout."""
    paged = common.paged
    host = common.host
    if host is None:
        if paged.max_query_len != 1:
            raise ValueError("invariant: a latent attention step without a host layout runs decodes only")
        return _split(common, (), slice(None), None, paged.max_seq_len)
    if all(length == 1 for length in paged.query_lens):
        return _split(common, (), slice(None), None, max(host.seq_lens, default=0))
    device = common.slot_mapping.device
    prefills: list[PrefillSpan] = []
    decode_rows: list[int] = []
    decode_seqs: list[int] = []
    query_start = 0
    for seq, query_len in enumerate(paged.query_lens):
        if query_len == 1:
            decode_rows.append(query_start)
            decode_seqs.append(seq)
        else:
            prefills.append(prefill_span(query_start, query_len, host, seq, block_size, device))
        query_start += query_len
    if not decode_rows:
        return _split(common, tuple(prefills), None, None, 0)
    rows = to_device(torch.tensor(decode_rows, dtype=torch.long), device)
    seqs = to_device(torch.tensor(decode_seqs, dtype=torch.int32), device)
    return _split(common, tuple(prefills), rows, seqs, max(host.seq_lens[seq] for seq in decode_seqs))


def _split(
    common: AttentionMetadata,
    prefills: tuple[PrefillSpan, ...],
    decode_rows: torch.Tensor | slice | None,
    decode_seqs: torch.Tensor | None,
    decode_max_seq_len: int,
) -> TritonLatentMetadata:
    return TritonLatentMetadata(
        slot_mapping=common.slot_mapping,
        paged=common.paged,
        host=common.host,
        prefills=prefills,
        decode_rows=decode_rows,
        decode_seqs=decode_seqs,
        decode_max_seq_len=decode_max_seq_len,
    )
