"""The LoRA deltas of a step's rows grouped by adapter, in torch (CPU): one shrink `x @ A^T` and one expand `@ B^T`
per adapter present, never a loop over rows."""

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
