"""How many weights a loaded model holds on this rank, and how many of them one token reads."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from tandem_server.layers.moe import SparseMoeBlock


@dataclass(frozen=True)
class ParameterCounts:
    """Elements of this rank's parameters: all of them, and those a token reads (all but its unchosen experts')."""

    total: int
    active: int

    def describe(self) -> str:
        if self.active == self.total:
            return f"{_millions(self.total)} parameters"
        return f"{_millions(self.total)} parameters, {_millions(self.active)} active per token"


def parameter_counts(model: nn.Module) -> ParameterCounts:
    """Counts `model`'s parameters as loaded, before any are quantized (a tied head's weight counts once); experts
    count the weights they hold, which packed ones (MXFP4) hold in fewer elements."""
    blocks = [module for module in model.modules() if isinstance(module, SparseMoeBlock)]
    stored = sum(param.numel() for block in blocks for param in block.experts.parameters())
    experts = sum(block.experts.parameter_count() for block in blocks)
    total = sum(param.numel() for param in model.parameters()) - stored + experts
    inactive = sum(block.inactive_parameter_count() for block in blocks)
    return ParameterCounts(total, total - inactive)


def _millions(count: int) -> str:
    return f"{count / 1e6:.2f}M"
