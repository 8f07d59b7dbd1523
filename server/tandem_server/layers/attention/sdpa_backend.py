"""One batched torch SDPA call per step over keys gathered through the block tables (any device, no softcap)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tandem_server.device_copy import to_device
from tandem_server.interfaces.attention import BackendSettings
from tandem_server.interfaces.attention_registry import SDPA_CAPABILITIES
from tandem_server.layers.attention.backend import AttentionParams, CommonMetadataOnly, LayerCache, write_step_kv
from tandem_server.layers.attention.metadata import AttentionMetadata, PagedLayout, start_offsets


class SdpaAttentionBackend(CommonMetadataOnly):
    """The last CUDA fallback: one kernel call for the step's decodes, padded only to their longest context, and
    one per prompt chunk, unpadded; a mixed step never pads a decode to a prompt chunk's query length."""

    name = "sdpa"
    capabilities = SDPA_CAPABILITIES
    supports_cuda_graphs = SDPA_CAPABILITIES.cuda_graphs

    @classmethod
    def from_settings(cls, settings: BackendSettings) -> SdpaAttentionBackend:
        """The backend; it reads none of the settings."""
        return cls()

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        cache: LayerCache,
        metadata: AttentionMetadata,
        params: AttentionParams,
    ) -> torch.Tensor:
        """Writes the step's K/V, gathers each sequence's context from its blocks and attends group by group."""
        if params.logit_softcap is not None:
            raise ValueError("the sdpa attention backend cannot apply a logit softcap")
        if params.sinks is not None:
            raise ValueError("the sdpa attention backend cannot add attention sinks")
        write_step_kv(cache, key, value, metadata.slot_mapping)
        paged = metadata.paged
        groups = _query_groups(paged.query_lens)
        if metadata.host is None or len(groups) <= 1:
            return _attend_padded(query, cache, paged, params)
        output = torch.empty_like(query)
        for group in groups:
            rows, layout = _group_layout(paged, metadata.host.seq_lens, group, query.device)
            output[rows] = _attend_padded(query[rows], cache, layout, params)
        return output


def _query_groups(query_lens: tuple[int, ...]) -> list[list[int]]:
    """Sequence indices attended together: every single-token query in one group, each longer query alone."""
    decodes = [index for index, length in enumerate(query_lens) if length == 1]
    chunks = [[index] for index, length in enumerate(query_lens) if length > 1]
    return ([decodes] if decodes else []) + chunks


def _group_layout(
    paged: PagedLayout, seq_lens: tuple[int, ...], group: list[int], device: torch.device
) -> tuple[torch.Tensor, PagedLayout]:
    """The query rows of the sequences in `group`, and the layout of those sequences alone (built on the host)."""
    starts = [0]
    for length in paged.query_lens:
        starts.append(starts[-1] + length)
    query_lens = [paged.query_lens[index] for index in group]
    group_seq_lens = [seq_lens[index] for index in group]
    rows = torch.tensor([row for index in group for row in range(starts[index], starts[index + 1])])
    rows = to_device(rows, device)
    layout = PagedLayout(
        query_start_loc=to_device(start_offsets(query_lens), device),
        seq_lens=to_device(torch.tensor(group_seq_lens, dtype=torch.int32), device),
        block_tables=paged.block_tables[to_device(torch.tensor(group), device)],
        max_query_len=max(query_lens),
        max_seq_len=max(group_seq_lens),
        query_lens=tuple(query_lens),
    )
    return rows, layout


def _attend_padded(query: torch.Tensor, cache: LayerCache, paged: PagedLayout, params: AttentionParams) -> torch.Tensor:
    """One SDPA call over `paged`'s sequences, each padded to its longest query and context."""
    block_size = cache.key.shape[1]
    rows, columns = _padded_query_index(paged, query.shape[0], query.device)
    padded_query = query.new_zeros(paged.num_seqs, paged.max_query_len, *query.shape[1:])
    padded_query[rows, columns] = query
    keys = _gather_context(cache.key, paged, block_size)
    values = _gather_context(cache.value, paged, block_size)
    groups = query.shape[1] // keys.shape[2]
    mask = _visibility_mask(paged, params.sliding_window, query.device)
    attended = F.scaled_dot_product_attention(
        padded_query.transpose(1, 2),
        keys.transpose(1, 2).repeat_interleave(groups, dim=1).to(query.dtype),
        values.transpose(1, 2).repeat_interleave(groups, dim=1).to(query.dtype),
        attn_mask=mask.unsqueeze(1),
        scale=params.scale,
    )
    return attended.transpose(1, 2)[rows, columns]


def _padded_query_index(paged: PagedLayout, num_rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence, index within its query) of each of the `num_rows` flat query rows, in batch order."""
    query_lens = (paged.query_start_loc[1:] - paged.query_start_loc[:-1]).long()
    # A host-known output size keeps repeat_interleave from synchronising with the device.
    rows = torch.repeat_interleave(torch.arange(paged.num_seqs, device=device), query_lens, output_size=num_rows)
    columns = torch.arange(rows.shape[0], device=device) - paged.query_start_loc[rows].long()
    return rows, columns


def _visibility_mask(paged: PagedLayout, window: int | None, device: torch.device) -> torch.Tensor:
    """[sequences, max_query, max_seq] True where a query may see a key: causal, in range, inside the window."""
    query_lens = (paged.query_start_loc[1:] - paged.query_start_loc[:-1]).long()
    seq_lens = paged.seq_lens.long()
    # Query i of a sequence sits at position seq_len - query_len + i; its keys are positions 0..that position.
    query_index = torch.arange(paged.max_query_len, device=device)
    query_positions = (seq_lens - query_lens).unsqueeze(1) + query_index
    key_positions = torch.arange(paged.max_seq_len, device=device)
    visible = key_positions.view(1, 1, -1) <= query_positions.unsqueeze(2)
    if window is not None:
        visible &= key_positions.view(1, 1, -1) > (query_positions - window).unsqueeze(2)
    # Padding rows (beyond a sequence's query) see key 0 only, so the softmax stays finite; they are dropped.
    # Element-wise only: boolean-mask indexing would synchronise with the device.
    padding = query_index.view(1, -1) >= query_lens.unsqueeze(1)
    visible = visible & ~padding.unsqueeze(2)
    visible[..., 0] |= padding
    return visible


def _gather_context(cache: torch.Tensor, paged: PagedLayout, block_size: int) -> torch.Tensor:
    # [sequences, blocks, block_size, kv_heads, dim] -> [sequences, max_seq_len, kv_heads, dim].
    blocks_needed = -(-paged.max_seq_len // block_size)
    gathered = cache[paged.block_tables[:, :blocks_needed].long()]
    return gathered.flatten(1, 2)[:, : paged.max_seq_len]
