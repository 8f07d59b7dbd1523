"""Helpers for sampling tests: batches from plain parameters."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tandem_server.sampling import SamplingBatch, SamplingParams, SamplingRow
from tandem_server.sampling.statistics import TokenStatistics

CPU = torch.device("cpu")


def batch_of(params: Sequence[SamplingParams], positions: Sequence[int]) -> SamplingBatch:
    """A batch of rows with no history, bans or alternatives."""
    return SamplingBatch.build([SamplingRow(p, pos) for p, pos in zip(params, positions, strict=True)], CPU)


def row_with_history(
    params: SamplingParams,
    position: int,
    token_ids: Sequence[int],
    prompt_len: int,
    vocab_size: int,
    **fields: object,
) -> SamplingRow:
    """A row whose request holds `token_ids` (the first `prompt_len` prompted), with its statistics as a shard
    builds them."""
    statistics = TokenStatistics(params, token_ids, prompt_len, vocab_size, CPU)
    return SamplingRow(params, position, statistics=statistics, **fields)  # type: ignore[arg-type]
