"""The CPU's two forms of a step's LoRA deltas give the same result: grouped by adapter over its rows, and stacked
over all rows with each row keeping its own adapter's columns; base rows are left exactly as the base GEMM gave them."""

from __future__ import annotations

import torch
from tandem_server.lora.adapter import LoraDelta
from tandem_server.lora.segmented import AdapterStack, GroupedDeltas, RowsDelta, StackedDeltas


def test_stacked_and_grouped_deltas_agree_and_leave_base_rows_alone() -> None:
    generator = torch.Generator().manual_seed(0)
    in_features, out_features, rows = 40, 24, 11
    deltas = {
        number: LoraDelta(
            torch.randn(rank, in_features, generator=generator), torch.randn(out_features, rank, generator=generator)
        )
        for number, rank in ((1, 8), (2, 4), (3, 16))
    }
    # Adapter 2 changes other modules only: its rows get nothing here.
    numbered = [(1, deltas[1]), (3, deltas[3])]
    row_adapter = torch.tensor([0, 1, 3, 3, 0, 2, 1, 1, 0, 3, 2])
    x = torch.randn(rows, in_features, generator=generator)
    base = torch.randn(rows, out_features, generator=generator)
    grouped = GroupedDeltas(
        tuple(RowsDelta((row_adapter == number).nonzero().squeeze(1), delta) for number, delta in numbered)
    ).add(base, x)
    stacked = StackedDeltas.of(AdapterStack.of(numbered), row_adapter).add(base, x)
    torch.testing.assert_close(stacked, grouped, rtol=1e-5, atol=1e-5)
    untouched = (row_adapter == 0) | (row_adapter == 2)
    assert torch.equal(stacked[untouched], base[untouched])
    assert not torch.allclose(stacked[row_adapter == 1], base[row_adapter == 1])
