"""One step's adapters: the rows each adapter runs on, and the weight formats that add their deltas to the outputs
of the GEMM modules they change while the step runs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from tandem_server.layers.gemm import GemmModule
from tandem_server.lora.adapter import LoraDelta
from tandem_server.lora.segmented import add_segmented_deltas
from tandem_server.quant.format import WeightFormat
from tandem_server.quant.kernels import QuantizedWeight


@dataclass(frozen=True)
class RowsDelta:
    """One adapter's delta on one GEMM module, for the step's rows under that adapter (ascending)."""

    rows: torch.Tensor
    delta: LoraDelta


class LoraFormat:
    """The module's own format, then each adapter's delta added to its rows: works over any format (float,
    quantized, prepacked), since the base GEMM runs unchanged and the deltas follow it."""

    def __init__(self, base: WeightFormat, deltas: tuple[RowsDelta, ...]) -> None:
        self.base = base
        self.deltas = deltas

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def nbytes(self) -> int:
        return self.base.nbytes

    @property
    def quantized(self) -> QuantizedWeight | None:
        return self.base.quantized

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return add_segmented_deltas(self.base.linear(x, bias), x, self.deltas)


@dataclass(frozen=True)
class LoraStep:
    """The step's adapter rows, as the deltas each changed GEMM module adds; a step without adapter rows has none
    (its batch carries None), and runs the model exactly as without LoRA."""

    changes: tuple[tuple[GemmModule, tuple[RowsDelta, ...]], ...]
    # How many distinct adapters the step runs (for the executors and logs).
    num_adapters: int

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """While open, every changed module multiplies through a LoraFormat; its own format is back afterwards,
        whatever happened (the next step may have no adapter rows)."""
        swapped: list[tuple[GemmModule, WeightFormat]] = []
        try:
            for module, deltas in self.changes:
                swapped.append((module, module.weight_format))
                module.weight_format = LoraFormat(module.weight_format, deltas)
            yield
        finally:
            for module, base in swapped:
                module.weight_format = base
