"""The rotary positions of a request whose images lay their tokens out in grids (multimodal rotary, M-RoPE).

An image token at row r, column c of a span whose first rotary position is p takes (p, p + r, p + c) as its temporal,
height and width positions; the tokens after the span continue from p + max(rows, columns). Every other token's three
positions are equal. So a request's rotary positions fall further behind its sequence positions after each image,
and the positions of any chunk follow from the request's grids alone, whether or not its images are encoded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from tandem_server.device_copy import to_device
from tandem_server.execution.batch import ScheduledSpan

AXES = 3


@dataclass(frozen=True)
class ImageGrid:
    """An image's span [offset, end) of `rows` x `columns` tokens, row-major."""

    offset: int
    rows: int
    columns: int

    @property
    def end(self) -> int:
        return self.offset + self.rows * self.columns

    @property
    def lag(self) -> int:
        """How much further the rotary positions after the span fall behind the sequence positions."""
        return self.rows * self.columns - max(self.rows, self.columns)


@dataclass(frozen=True)
class GridPositions:
    """A request's image grids, in prompt order and not overlapping."""

    grids: tuple[ImageGrid, ...]

    @property
    def end(self) -> int:
        """The end of the last image's span."""
        return max((grid.end for grid in self.grids), default=0)

    @property
    def lag(self) -> int:
        """How far the rotary positions after the last image fall behind the sequence positions."""
        return sum(grid.lag for grid in self.grids)

    def chunk(self, start: int, count: int) -> torch.Tensor:
        """The rotary positions `[3, count]` of sequence positions [start, start + count)."""
        positions = torch.arange(start, start + count).expand(AXES, -1).clone()
        lag = 0
        for grid in self.grids:
            first, last = max(start, grid.offset), min(start + count, grid.end)
            if first < last:
                cells = torch.arange(first - grid.offset, last - grid.offset)
                origin = grid.offset - lag
                rows = slice(first - start, last - start)
                positions[0, rows] = origin
                positions[1, rows] = origin + cells // grid.columns
                positions[2, rows] = origin + cells % grid.columns
            positions[:, max(grid.end - start, 0) :] -= grid.lag
            lag += grid.lag
        return positions


def rotary_positions(
    spans: Sequence[ScheduledSpan], grids: Mapping[int, GridPositions], device: torch.device
) -> torch.Tensor:
    """The step's rotary positions for the spans flattened in order, where some span's request has image grids
    (`grids`, by request id): `[tokens]` when every span is past its request's images (as decodes are), so graphs of
    the model replay the step; else `[3, tokens]`."""
    lags = []
    for span in spans:
        request_grids = grids.get(span.request_id) if span.request_id is not None else None
        if request_grids is not None and span.start_position < request_grids.end:
            return to_device(_three_axis_positions(spans, grids), device)
        lags.append(request_grids.lag if request_grids is not None else 0)
    ranges = [torch.arange(span.start_position, span.context_len) - lag for span, lag in zip(spans, lags, strict=True)]
    return to_device(torch.cat(ranges), device)


def _three_axis_positions(spans: Sequence[ScheduledSpan], grids: Mapping[int, GridPositions]) -> torch.Tensor:
    chunks = []
    for span in spans:
        request_grids = grids.get(span.request_id) if span.request_id is not None else None
        if request_grids is None:
            chunks.append(torch.arange(span.start_position, span.context_len).expand(AXES, -1))
        else:
            chunks.append(request_grids.chunk(span.start_position, len(span.token_ids)))
    return torch.cat(chunks, dim=1)
