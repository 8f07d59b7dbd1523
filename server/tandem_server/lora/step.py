"""One step's adapters: the weight formats that add their deltas to the outputs of the GEMM modules they change,
in place only while the step runs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from tandem_server.layers.gemm import GemmModule
from tandem_server.quant.format import WeightFormat
from tandem_server.quant.kernels import QuantizedWeight


class StepDeltas(Protocol):
    """The deltas of one GEMM module for the step's adapter rows."""

    def add(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """`out` (the base GEMM's output for `x`) with each adapter row's delta added; other rows unchanged."""
        ...


class LoraFormat:
    """The module's own format, then the step's deltas added to the adapter rows: works over any format (float,
    quantized, prepacked), since the base GEMM runs unchanged and the deltas follow it."""

    def __init__(self, base: WeightFormat, deltas: StepDeltas) -> None:
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
        return self.deltas.add(self.base.linear(x, bias), x)


@dataclass(frozen=True)
class LoraStep:
    """The deltas each changed GEMM module adds in one step; a step without adapter rows has none (its batch
    carries None), and runs the model exactly as without LoRA."""

    changes: tuple[tuple[GemmModule, StepDeltas], ...]
    # How many distinct adapters the step runs.
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
