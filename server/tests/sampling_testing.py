"""Helpers for sampling tests: batches from plain parameters."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tandem_server.sampling import SamplingBatch, SamplingParams, SamplingRow

CPU = torch.device("cpu")


def batch_of(params: Sequence[SamplingParams], positions: Sequence[int]) -> SamplingBatch:
    """A batch of rows with no history, bans or alternatives."""
    return SamplingBatch.build([SamplingRow(p, pos) for p, pos in zip(params, positions, strict=True)], CPU)
