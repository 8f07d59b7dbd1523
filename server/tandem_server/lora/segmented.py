"""The LoRA deltas of a step's rows, grouped by adapter: one shrink `x @ A^T` and one expand `@ B^T` per adapter
present, never a loop over rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from tandem_server.lora.step import RowsDelta


def add_segmented_deltas(out: torch.Tensor, x: torch.Tensor, deltas: Sequence[RowsDelta]) -> torch.Tensor:
    """`out` with each adapter's `(x[rows] @ a.T) @ b.T` added to its rows; rows under no adapter are untouched.
    A new tensor: `out` may be a format's persistent buffer."""
    for change in deltas:
        delta = change.delta
        shrunk = x.index_select(0, change.rows) @ delta.a.T
        out = out.index_add(0, change.rows, (shrunk @ delta.b.T).to(out.dtype))
    return out
