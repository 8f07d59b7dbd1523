"""The LoRA deltas of a step's rows in torch (CPU), never a loop over rows: grouped by adapter (one shrink `x @ A^T`
and one expand `@ B^T` per adapter present, over its rows), or stacked (every adapter's A and B side by side, two
matmuls over all rows, each row keeping its own adapter's columns) for small batches, where the grouped form's
handful of small operations per adapter costs more than the stacked form's wasted products."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem_server.lora.adapter import LoraDelta


@dataclass(frozen=True)
class RowsDelta:
    """One adapter's delta on one GEMM module, for the step's rows under that adapter (ascending)."""

    rows: torch.Tensor
    delta: LoraDelta


@dataclass(frozen=True)
class GroupedDeltas:
    """Every adapter's delta on one GEMM module, each over its own rows."""

    groups: tuple[RowsDelta, ...]

    def add(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """A new tensor: `out` may be a format's persistent buffer."""
        for group in self.groups:
            delta = group.delta
            shrunk = x.index_select(0, group.rows) @ delta.a.T
            out = out.index_add(0, group.rows, (shrunk @ delta.b.T).to(out.dtype))
        return out


# Steps of at most this many rows (decode batches) run the stacked form.
STACKED_ROWS = 64


@dataclass(frozen=True)
class AdapterStack:
    """The adapters of one step that change one GEMM module, side by side: `a` [sum of their ranks x projections,
    in], `b` [module rows, same], and `owner` [same]: the adapter number (1, 2, ...) each column belongs to."""

    a: torch.Tensor
    b: torch.Tensor
    owner: torch.Tensor

    @classmethod
    def of(cls, numbered: list[tuple[int, LoraDelta]]) -> AdapterStack:
        owner = torch.cat([torch.full((delta.a.shape[0],), number) for number, delta in numbered])
        return cls(
            torch.cat([delta.a for _, delta in numbered]),
            torch.cat([delta.b for _, delta in numbered], dim=1),
            owner.to(numbered[0][1].a.device),
        )


@dataclass(frozen=True)
class StackedDeltas:
    """Every adapter's delta on one GEMM module in two matmuls over all the step's rows; `keep` [rows, columns] is 1
    where the column is the row's own adapter's and 0 elsewhere, so base rows get exact zeros."""

    stack: AdapterStack
    keep: torch.Tensor

    @classmethod
    def of(cls, stack: AdapterStack, row_adapter: torch.Tensor) -> StackedDeltas:
        return cls(stack, (row_adapter[:, None] == stack.owner[None, :]).to(stack.a.dtype))

    def add(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """A new tensor: `out` may be a format's persistent buffer."""
        shrunk = (x.to(self.stack.a.dtype) @ self.stack.a.T) * self.keep
        return out + (shrunk @ self.stack.b.T).to(out.dtype)
